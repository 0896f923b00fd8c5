"""G-FAULT after the run: a timed event (docs/plans.md "Events") that its host performed late.

The plan fixes when an event acts; the run's result is read against that time (the report marks it, the
windows are cut at it). An agent whose host could not keep time -- its event loop woke late, or `tc` took long
to return on a loaded or emulated CPU -- performed the event somewhere else in the run, so the run says so.
Two bounds, both from the event's own record (run_event rows, orchestrator/ingest/events.py):
- issued: the agent started the change more than ISSUE_LATE_NS after the scheduled time (its timer; on an
  idle host it issues within about a millisecond);
- in force: the change command returned more than EFFECTIVE_LATE_NS after its scheduled time, for the start
  and, for a timed action with an end (ack_blackout), the end. This is an upper bound on when the kernel
  applied it, so its bound is the looser one.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.ingest.events import event_lag_ns
from schemas.flag import Flag

ISSUE_LATE_NS = 20_000_000
EFFECTIVE_LATE_NS = 100_000_000


def _late(label: str, scheduled: int | None, done: int | None, bound: int) -> str | None:
    lag = event_lag_ns(scheduled, done) if scheduled is not None else None
    if lag is None or lag <= bound:
        return None
    return f"{label} {lag / 1e6:.1f} ms after its scheduled time (bound {bound / 1e6:.0f} ms)"


def event_findings(events: Iterable[Mapping[str, Any]]) -> list[Flag]:
    """G-FAULT: one flag per event issued or in force later than its bound, naming both times."""
    flags = []
    for ev in events:
        found = [m for m in (
            _late("issued", ev["scheduled_ns"], ev.get("issued_ns"), ISSUE_LATE_NS),
            _late("in force", ev["scheduled_ns"], ev.get("effective_ns"), EFFECTIVE_LATE_NS),
            _late("ended", ev.get("end_scheduled_ns"), ev.get("end_effective_ns"), EFFECTIVE_LATE_NS),
        ) if m]
        if found:
            where = f" on {ev['interface']}" if ev.get("interface") else ""
            flags.append(Flag(guard="G-FAULT", host=ev["host"],
                              message=f"event {ev['event_index']} ({ev['action']}{where}) " + "; ".join(found)
                              + ": the host did not keep the plan's time, results around the event are shifted",
                              evidence={k: ev.get(k) for k in ("event_index", "scheduled_ns", "issued_ns",
                                                              "effective_ns", "end_scheduled_ns",
                                                              "end_effective_ns")}))
    return flags
