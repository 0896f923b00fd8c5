"""run.flags: each flag a JSON object {guard, host, message, accepted, evidence} instead of a line of text.

Older runs stored lines in five formats; each is read into an object here (a frozen copy of the rule in
schemas/flag.py as of this revision), so every run in the database has flags of one shape.
Downgrade writes the lines back (`accepted G-NETEM host aqm: message`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LINE = re.compile(r"^(?P<acc>accepted )?(?P<guard>[GM]-[A-Z0-9]+)(?: host (?P<host>\S+))?: (?P<msg>.*)$", re.S)
_EMBEDDED = re.compile(r"\((?P<guard>[GM]-[A-Z0-9]+)\)")


def _object(line: str) -> dict:
    if m := _LINE.match(line):
        out = {"guard": m["guard"], "message": m["msg"]}
        out.update({"host": m["host"]} if m["host"] else {})
        out.update({"accepted": True} if m["acc"] else {})
        return out
    host, _, rest = line.partition(": ")
    role = host.split("/")[0] if rest else None
    guard = ((m := _EMBEDDED.search(line)) and m["guard"]) or (
        "G-RESET" if rest.startswith("reset left ") else "G-NIC" if "off by absence" in rest else "G-TASK")
    return {"guard": guard, "message": rest or line, **({"host": role} if role else {})}


def _line(flag: dict) -> str:
    host = f" host {flag['host']}" if flag.get("host") else ""
    return f"{'accepted ' if flag.get('accepted') else ''}{flag['guard']}{host}: {flag['message']}"


def _rewrite(convert) -> None:
    bind = op.get_bind()
    run = sa.table("run", sa.column("run_id", sa.String), sa.column("flags", sa.JSON))
    for run_id, flags in bind.execute(sa.select(run.c.run_id, run.c.flags)).all():
        flags = json.loads(flags) if isinstance(flags, str) else (flags or [])
        new = [convert(f) for f in flags]
        if new != flags:
            bind.execute(sa.update(run).where(run.c.run_id == run_id).values(flags=new))


def upgrade() -> None:
    _rewrite(lambda f: _object(f) if isinstance(f, str) else f)


def downgrade() -> None:
    _rewrite(lambda f: _line(f) if isinstance(f, dict) else f)
