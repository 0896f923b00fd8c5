"""Timed plan events on the time-series plots (docs/reports.md): each run_event row becomes a mark at its
effective time (when the change was in force; the scheduled time if it never took effect), labelled with
the action and its new value, so an RTT step or a rate change can be read against the series."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestrator.plan.model.units import format_rate, format_time_ns


@dataclass(frozen=True)
class EventMark:
    t_s: float        # seconds since the run's t0
    label: str        # e.g. "set_delay 50ms"
    end_s: float | None = None   # ack_blackout: the window's end


@dataclass(frozen=True)
class EventRow:
    index: int
    action: str
    scheduled_ns: int
    effective_ns: int | None
    end_effective_ns: int | None
    detail: dict[str, Any]


def event_label(action: str, detail: dict[str, Any]) -> str:
    """The action and its new value, from the record's read-back-free part (the stage as sent)."""
    stage = (detail.get("stage") or {})
    if action == "set_delay" and "delay_ns" in stage:
        return f"set_delay {format_time_ns(stage['delay_ns'])}"
    if action == "set_loss" and "loss" in stage:
        return f"set_loss {stage['loss'] * 100:g}%"
    if action == "set_rate" and "rate_bit" in stage:
        return f"set_rate {format_rate(stage['rate_bit'])}"
    return action


def event_marks(rows: Sequence[EventRow], t0_ns: int) -> tuple[EventMark, ...]:
    out = []
    for r in sorted(rows, key=lambda r: r.scheduled_ns):
        at = r.effective_ns if r.effective_ns is not None else r.scheduled_ns
        end = (r.end_effective_ns - t0_ns) / 1e9 if r.end_effective_ns is not None else None
        out.append(EventMark((at - t0_ns) / 1e9, event_label(r.action, r.detail), end))
    return tuple(out)


def load_events(conn: Connection, run_id: str) -> list[EventRow]:
    """The run's run_event rows (none in a database from before revision 0011)."""
    if not sa.inspect(conn).has_table("run_event"):
        return []
    t = sa.table("run_event", sa.column("run_id"), sa.column("event_index"), sa.column("action"),
                 sa.column("scheduled_ns"), sa.column("effective_ns"), sa.column("end_effective_ns"),
                 sa.column("detail", sa.JSON))
    rows = conn.execute(sa.select(t.c.event_index, t.c.action, t.c.scheduled_ns, t.c.effective_ns,
                                  t.c.end_effective_ns, t.c.detail).where(t.c.run_id == run_id)).all()
    return [EventRow(int(r[0]), r[1], int(r[2]), r[3], r[4], r[5] or {}) for r in rows]
