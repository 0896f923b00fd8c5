"""A run's phase timings (the engine measures them: orchestrator/engine/timing.py) as the run row stores them
(`run.timing`), and the update that completes them once the run's ingest is over."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import Engine, update

from orchestrator.storage import tables


def store_timing(db: Engine, run_id: str, timing: dict) -> None:
    with db.begin() as conn:
        conn.execute(update(tables.run).where(tables.run.c.run_id == run_id).values(timing=timing))


# ------------------------------------------------------------------ phase timings of a run
PHASES = ("apply", "clock", "schedule", "wait_t0", "flows", "tail", "stop", "collect", "reset", "save", "ingest_wait",
          "ingest")


@dataclass
class RunTiming:
    """Phase durations (s) of one run, the flows' own planned duration, and the wall time the run held the
    testbed. overhead = wall - flows. `ingest` is the run's own ingest: in series for run_one, so counted in
    wall; overlapped by run_many, where the part the next run waited for is that run's `ingest_wait`, and
    the wait for the last run's ingest, after its slot, is `drain_s` (once per campaign, not in wall)."""
    phases: dict[str, float] = field(default_factory=dict)
    flows_s: float = 0.0
    wall_s: float = 0.0
    margins: dict[str, float] = field(default_factory=dict)
    drain_s: float = 0.0
    warmup_s: float = 0.0   # before the first run of run_many: the ingest worker's start (once per campaign)

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.wall_s - self.flows_s)

    def as_json(self) -> dict:
        return {"phases": {k: round(v, 4) for k, v in self.phases.items()}, "flows_s": round(self.flows_s, 4),
                "wall_s": round(self.wall_s, 4), "overhead_s": round(self.overhead_s, 4),
                "margins": {k: round(v, 4) for k, v in self.margins.items()}, "drain_s": round(self.drain_s, 4),
                "warmup_s": round(self.warmup_s, 4)}

    def line(self) -> str:
        """One line for `tcplab run`: overhead and its phases in ms."""
        parts = " ".join(f"{k}={v * 1000:.0f}" for k, v in self.phases.items() if k != "flows")
        drain = f"; then {self.drain_s:.2f} s for the campaign's last ingest" if self.drain_s else ""
        drain += f"; after {self.warmup_s:.2f} s for the ingest worker's start" if self.warmup_s else ""
        return (f"overhead {self.overhead_s:.2f} s (wall {self.wall_s:.2f} s, flows {self.flows_s:g} s; ms: {parts})"
                + drain)


class PhaseClock:
    """Marks phase boundaries on the monotonic clock into a RunTiming (the shell's stopwatch)."""

    def __init__(self, timing: RunTiming, now=time.monotonic):
        self.timing, self._now = timing, now
        self.began = self._last = now()
        self._phase: str | None = None

    def enter(self, phase: str | None) -> None:
        t = self._now()
        if self._phase is not None:
            self.timing.phases[self._phase] = self.timing.phases.get(self._phase, 0.0) + (t - self._last)
        self._phase, self._last = phase, t

    def add(self, phase: str, seconds: float) -> None:
        self.timing.phases[phase] = self.timing.phases.get(phase, 0.0) + seconds

    def divide(self, phases: tuple[str, ...], cuts: list[float]) -> None:
        """End the current phase now, its time divided among `phases` at the `cuts` (monotonic times, one
        fewer than phases; each held inside the phase's span and after the previous cut)."""
        t = self._now()
        bounds = [self._last]
        for c in cuts:
            bounds.append(min(t, max(bounds[-1], c)))
        bounds.append(t)
        for name, a, b in zip(phases, bounds[:-1], bounds[1:], strict=True):
            self.timing.phases[name] = self.timing.phases.get(name, 0.0) + (b - a)
        self._phase, self._last = None, t

    def close(self) -> None:
        """End the current phase; wall = from the first mark to now."""
        self.enter(None)
        self.timing.wall_s = self._last - self.began
