"""The base of every plan model and the documented-field helper (the schema shows what `_f` records)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Base of every plan model: unknown fields are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _f(default: Any, description: str, example: Any, unit: str | None = None, **kw: Any) -> Any:
    """A documented field: every plan field carries a description and an example (the schema shows both);
    plain numbers also name their unit (quantity types carry theirs)."""
    extra = {"unit": unit} if unit else None
    return Field(default, description=description, examples=[example], json_schema_extra=extra, **kw)
