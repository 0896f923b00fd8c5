"""G-CLOCK, after the clock exchange: a host whose clock is off by more than 1 ms invalidates the run's
cross-host metrics (one-way and queue delays paired across hosts)."""
from __future__ import annotations

from schemas.flag import Flag

CLOCK_THRESHOLD_NS = 1_000_000


def clock_findings(offsets_ns: dict[str, int], threshold_ns: int = CLOCK_THRESHOLD_NS) -> list[Flag]:
    """G-CLOCK: a host whose clock is off by more than the threshold invalidates cross-host metrics."""
    return [Flag(guard="G-CLOCK", host=host,
                 message=f"clock offset {off / 1e3:.0f} us exceeds {threshold_ns / 1e3:.0f} us: "
                    "cross-host metrics of this run are invalid")
            for host, off in sorted(offsets_ns.items()) if abs(off) > threshold_ns]
