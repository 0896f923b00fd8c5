"""G-TASK after the run: an app-limited writer (agents/appwriter.py) or a bulk sender (agents/bulksend.py) that
did not keep its schedule.

A thin-stream run is about what happens to writes made at the plan's instants; its metrics (M-APPLAT, M-APPREAD)
are measured from each write's real time, but the stream's pattern -- the gaps that decide whether a write finds
an idle or a busy connection, whether the RTO or a tail loss probe fires -- is the plan's only while the writer
is on time. A loaded host delays the (SCHED_FIFO) writer now and then; one write in a hundred is noise, more is
a different stream. Counted from the writer's own log, from its first write on (instants skipped before it,
while the connection was coming up, are the flow's start, which the start-skew fold reports):
- late: a write made later after its instant than M-APPLOSS's threshold, max(1 ms, 4 % of the interval)
  (analysis/thinstream.late_threshold_ns; the writer spins the last 0.3 ms, so on an idle host it writes within
  a few microseconds);
- skipped: an instant reached more than half an interval late, which the writer leaves out rather than burst.

A bulk sender's promise is its flows' first data at the start instant, together. Its log says when each flow's
first send() began, in its own host's clock as the instant it was given; a first send later than
LATE_RELEASE_NS means the host stalled the sender (or its connects ran past the instant), and the flows started
when the host let them, not when the plan said.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from analysis.thinstream import late_threshold_ns
from orchestrator.ingest.applog import SKIPPED
from orchestrator.plan.expansion.runspec import FlowSpec
from schemas.flag import Flag

MAX_OFF_SCHEDULE = 0.01      # the share of instants that may be late or skipped before the run is flagged
# On an idle host the first sends come 0.01-0.15 ms after the instant; in a UML host each send() costs ~0.2 ms,
# so the 16th flow's first send starts ~3 ms after it. Above that the host held the sender back.
LATE_RELEASE_NS = 5_000_000


def off_schedule(rows: np.ndarray, late_ns: float) -> tuple[int, int, int, float]:
    """(instants counted, writes made more than late_ns after their instant, skipped instants, worst lateness in
    ms) of one writer's log rows."""
    made = np.flatnonzero(rows["accepted"] != SKIPPED)
    rows = rows[made[0]:] if made.size else rows[:0]
    lateness = rows["t_ns"] - rows["sched_ns"]
    skipped = rows["accepted"] == SKIPPED
    late = ~skipped & (lateness > late_ns)
    worst = float(lateness.max()) / 1e6 if rows.size else 0.0
    return int(rows.size), int(late.sum()), int(skipped.sum()), worst


def writer_findings(flows: Sequence[FlowSpec], app_writes: Iterable[tuple[int, np.ndarray]]) -> list[Flag]:
    """One G-TASK flag per writer whose late writes and skipped instants exceed MAX_OFF_SCHEDULE of its instants."""
    by_id = {f.flow_id: f for f in flows}
    flags = []
    for flow_id, rows in app_writes:
        f = by_id[flow_id]
        late_ns = late_threshold_ns((f.write_interval_s or 0) * 1e9)
        total, late, skipped, worst = off_schedule(rows, late_ns)
        if total == 0 or (late + skipped) <= MAX_OFF_SCHEDULE * total:
            continue
        flags.append(Flag(
            guard="G-TASK", host=f.src,
            message=f"app writer of flow {flow_id} (port {f.port}): {late} of {total} writes more than "
                    f"{late_ns / 1e6:g} ms after their instant, {skipped} instants skipped (worst {worst:.1f} ms "
                    f"late): the host did not keep the stream's schedule, its pattern is not the plan's there",
            evidence={"flow_id": flow_id, "instants": total, "late": late, "skipped": skipped,
                      "worst_late_ms": round(worst, 3), "late_bound_ms": late_ns / 1e6}))
    return flags


def bulk_release_findings(flows: Sequence[FlowSpec], sends: dict[int, dict[str, Any]]) -> list[Flag]:
    """One G-TASK flag per bulk sender host whose flows' first send() began more than LATE_RELEASE_NS after
    their instant (`sends`: flow_id -> its entry of the sender's log, ingest.bulkflows.sender_logs)."""
    late: dict[str, list[tuple[int, float]]] = {}
    for f in flows:
        entry = sends.get(f.flow_id)
        if entry is None or entry.get("first_send_ns") is None:
            continue
        lateness = int(entry["first_send_ns"]) - int(entry["instant_ns"])
        if lateness > LATE_RELEASE_NS:
            late.setdefault(f.src, []).append((f.flow_id, lateness / 1e6))
    return [Flag(guard="G-TASK", host=host,
                 message=f"bulk sender: the first data of flows {', '.join(str(i) for i, _ in items)} was sent "
                         f"{min(ms for _, ms in items):.1f}-{max(ms for _, ms in items):.1f} ms after their start "
                         f"instant (bound {LATE_RELEASE_NS / 1e6:g} ms): the host held the sender back, the flows "
                         f"started when it let them",
                 evidence={"flows": [i for i, _ in items], "late_ms": [round(ms, 3) for _, ms in items],
                           "late_bound_ms": LATE_RELEASE_NS / 1e6})
            for host, items in sorted(late.items())]
