"""Which session owns the host's run: a pure decision, no sockets.

The session that applies, schedules, stops, collects or resets becomes the owner; while its connection is
open, every run op from another session is refused at once as `busy`, naming the owner. When the owner's
connection goes (a manager killed mid-run, a network cut, `bye`), the run is orphaned and the next session
that asks takes it over -- so a restarted manager can always `reset` the host.
"""
from __future__ import annotations

from dataclasses import dataclass

RUN_OPS = frozenset({"apply", "schedule", "stop", "collect", "status", "reset"})
CLAIMING_OPS = RUN_OPS - {"status"}   # reading status does not make a monitor the owner


@dataclass(frozen=True)
class SessionId:
    number: int       # per agent process, in connection order
    client: str       # the name the manager gave in hello (validated by pattern)
    peer: str         # address the connection came from

    def describe(self) -> str:
        return f"session #{self.number} ({self.client!r} from {self.peer})"


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    field: str | None


class RunOwnership:
    def __init__(self) -> None:
        self.owner: SessionId | None = None
        self.owner_connected = False

    def refusal(self, op: str, session: SessionId, run_id: str | None) -> Refusal | None:
        """Why `session` may not run `op` now, or None."""
        if op not in RUN_OPS or self.owner is None or not self.owner_connected or self.owner == session:
            return None
        what = f"run {run_id}" if run_id else "this host"
        return Refusal("busy", f"{what} is owned by {self.owner.describe()}, still connected; it is "
                               "released when that connection closes", "run_id")

    def after(self, op: str, session: SessionId) -> str | None:
        """Record a granted `op`; returns a log message when it took over an orphaned run."""
        if op not in CLAIMING_OPS or self.owner == session:
            return None
        previous, self.owner, self.owner_connected = self.owner, session, True
        if previous is not None:
            return f"{session.describe()} took over from {previous.describe()}, disconnected"
        return None

    def disconnected(self, session: SessionId | None) -> bool:
        """The connection of `session` closed; True when it owned the run (now takeable)."""
        if session is not None and session == self.owner and self.owner_connected:
            self.owner_connected = False
            return True
        return False
