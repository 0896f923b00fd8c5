"""G-WINDOW: analysis windows as explicit values (warm-up exclusion, all-flows-active, measure length).

Every metric that summarises a run over time takes a Window; which window a result used is stored
with it (the report prints it), never picked by hand.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Window:
    """[start_ns, end_ns] in capture-clock ns; `rule` says how it was derived (shown in reports)."""

    start_ns: int
    end_ns: int
    rule: str

    @property
    def length_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def empty(self) -> bool:
        return self.end_ns <= self.start_ns


def in_window(ts_ns: np.ndarray, start_ns: int | None, end_ns: int | None) -> np.ndarray:
    """Boolean mask of ts in [start, end]; a None bound is open."""
    ts = np.asarray(ts_ns)
    mask = np.ones(ts.shape, dtype=bool)
    if start_ns is not None:
        mask &= ts >= start_ns
    if end_ns is not None:
        mask &= ts <= end_ns
    return mask


def analysis_window(spans: Sequence[tuple[int, int]], t0_ns: int, warmup_s: float = 0.0,
                    measure_s: float | None = None, mode: str = "all_flows_active") -> Window:
    """The window metrics are computed over.

    spans: each flow's (first, last) data packet time. mode "all_flows_active": from the last flow's
    first packet to the first flow's last packet (LS-AIMD queue statistics); "run": from the first
    packet of any flow to the last. Then the warm-up (seconds after t0) is cut off the start, and a
    measure length, if given, cuts the end at start + measure. May come out empty (end <= start)
    when the flows never overlap; callers report that rather than widen it silently.
    """
    if not spans:
        return Window(t0_ns, t0_ns, f"{mode}: no data")
    firsts, lasts = zip(*spans, strict=True)
    if mode == "all_flows_active":
        start, end = max(firsts), min(lasts)
    elif mode == "run":
        start, end = min(firsts), max(lasts)
    else:
        raise ValueError(f"unknown window mode {mode!r}")
    rule = mode
    if warmup_s > 0:
        start = max(start, t0_ns + int(round(warmup_s * 1e9)))
        rule += f", warm-up {warmup_s:g} s"
    if measure_s is not None:
        end = min(end, start + int(round(measure_s * 1e9)))
        rule += f", measure {measure_s:g} s"
    return Window(int(start), int(end), rule)
