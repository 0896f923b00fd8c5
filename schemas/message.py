"""The base of every protocol message: unknown fields are refused (schemas/protocol.py, schemas/tasks.py)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")
