"""Flag: one guard's finding about one run, as a value (guard code, host, message, evidence).

Every remark a run carries -- a pre-run guard the plan accepted, a NIC request held by absence, a capture that
lost packets, a clock offset, a loaded CPU, drops outside the AQM -- is a Flag. It is stored in `run.flags` as a
JSON object and shown as one line (`str(flag)`). Codes are defined in docs/guards.md.
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

CODE = r"^[GM]-[A-Z0-9]+$"


class Flag(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    guard: str = Field(pattern=CODE, description="guard or metric code, e.g. G-NETEM (docs/guards.md)")
    host: str | None = Field(default=None, description="the role (or '+'-joined roles sharing a kernel) it is about")
    message: str = Field(description="what was found and what to change")
    accepted: bool = Field(default=False, description="a pre-run finding the plan accepted (accept_guards)")
    evidence: dict[str, Any] = Field(default_factory=dict, description="the numbers the finding rests on")

    def __hash__(self) -> int:   # evidence is a dict; equal flags share these four fields, so this is consistent
        return hash((self.guard, self.host, self.message, self.accepted))

    def __str__(self) -> str:
        where = f" host {self.host}" if self.host else ""
        return f"{'accepted ' if self.accepted else ''}{self.guard}{where}: {self.message}"

    def stored(self) -> dict[str, Any]:
        """The JSON object kept in run.flags (defaults left out)."""
        return self.model_dump(mode="json", exclude_defaults=True)

    @classmethod
    def from_stored(cls, value: dict[str, Any] | str) -> Flag:
        """A stored flag: an object, or a line from a database or ingest.json written before flags were values."""
        return cls.model_validate(value) if isinstance(value, dict) else parse_line(value)


_LINE = re.compile(r"^(?P<acc>accepted )?(?P<guard>[GM]-[A-Z0-9]+)(?: host (?P<host>\S+))?: (?P<msg>.*)$", re.S)
_EMBEDDED = re.compile(r"\((?P<guard>[GM]-[A-Z0-9]+)\)")


def parse_line(line: str) -> Flag:
    """Read a flag written as a line by older tcplab versions ("G-HTB host aqm: ...", "accepted G-NETEM ...",
    "role: reset left ...", "role: dev: coalescing ... off by absence", "role/task: ... (G-CAPTURE) ...")."""
    if m := _LINE.match(line):
        return Flag(guard=m["guard"], host=m["host"], message=m["msg"], accepted=bool(m["acc"]))
    host, _, rest = line.partition(": ")
    role = host.split("/")[0] if rest else None
    if m := _EMBEDDED.search(line):
        return Flag(guard=m["guard"], host=role, message=rest or line)
    if rest.startswith("reset left "):
        return Flag(guard="G-RESET", host=role, message=rest)
    if "off by absence" in rest:
        return Flag(guard="G-NIC", host=role, message=rest)
    return Flag(guard="G-TASK", host=role, message=rest or line)


def unique(flags: list[Flag]) -> list[Flag]:
    """Each flag once, first occurrence first (a re-ingest recomputes the post-run guards)."""
    return list(dict.fromkeys(flags))
