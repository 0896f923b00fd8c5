"""Name patterns shared by the plan models (roles, congestion controls, kernel variants)."""
from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

RoleName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
CcName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]{1,32}$")]
VariantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")]
