"""/proc/stat samples (the agent's cpu_load artifact) -> per-CPU load per sampling interval. Pure.

The artifact is literal kernel output: a header `# /proc/stat per-CPU lines, USER_HZ=100`, then per sample a
line `@ <CLOCK_REALTIME ns>` followed by the `cpuN` lines. Each `cpuN` line holds cumulative ticks: user nice
system idle iowait irq softirq steal [guest guest_nice] (guest time is already inside user/nice, so the
first eight fields are the whole of the CPU's time).

Busy (M-CPU, G-CPULOAD) is everything but idle and iowait, so softirq -- where the qdiscs, netem and the
forwarding path run -- and steal -- time a hypervisor gave to someone else -- both count: in either case the
CPU did not run this host's network stack when it was due.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
IDLE, IOWAIT, SOFTIRQ, STEAL = (FIELDS.index(f) for f in ("idle", "iowait", "softirq", "steal"))


@dataclass(frozen=True)
class CpuSamples:
    ts_ns: np.ndarray          # (n,) sample times
    cpus: tuple[str, ...]      # "cpu0", "cpu1", ...
    ticks: np.ndarray          # (n, len(cpus), 8) cumulative ticks

    def intervals(self) -> CpuIntervals:
        """Per interval between consecutive samples and per CPU: busy, softirq and steal shares of its ticks.
        An interval with no tick at all (shorter than 1/USER_HZ) is NaN."""
        d = np.diff(self.ticks, axis=0).astype(np.float64)
        total = d.sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = d / total[..., None]
        busy = 1.0 - share[..., IDLE] - share[..., IOWAIT]
        return CpuIntervals(self.ts_ns[:-1], self.ts_ns[1:], self.cpus, busy, share[..., SOFTIRQ],
                            share[..., STEAL])


@dataclass(frozen=True)
class CpuIntervals:
    start_ns: np.ndarray       # (m,)
    end_ns: np.ndarray         # (m,)
    cpus: tuple[str, ...]
    busy: np.ndarray           # (m, cpus) fraction of the interval's ticks not idle/iowait
    softirq: np.ndarray        # (m, cpus)
    steal: np.ndarray          # (m, cpus)

    def overlap_ns(self, window: tuple[int, int]) -> np.ndarray:
        """(m,) how much of each interval lies inside [window)."""
        lo, hi = window
        return np.clip(np.minimum(self.end_ns, hi) - np.maximum(self.start_ns, lo), 0, None)


def parse_cpu(text: str) -> CpuSamples:
    """Raises ValueError naming the line and why."""
    stamps: list[int] = []
    rows: list[list[list[int]]] = []
    cpus: list[str] | None = None
    current: list[tuple[str, list[int]]] = []

    def close(lineno: int) -> None:
        nonlocal cpus
        if not stamps:
            return
        names = [n for n, _ in current]
        if cpus is None:
            if not names:
                raise ValueError(f"line {lineno}: sample @ {stamps[-1]} has no cpuN lines")
            cpus = names
        elif names != cpus:
            raise ValueError(f"line {lineno}: sample @ {stamps[-1]} lists {' '.join(names) or 'no CPU'}, "
                             f"the first sample {' '.join(cpus)} (CPU hotplug during the run?)")
        rows.append([v for _, v in current])

    for lineno, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        if line.startswith("@ "):
            close(lineno)
            try:
                stamps.append(int(line[2:]))
            except ValueError:
                raise ValueError(f"line {lineno}: {line!r} is not '@ <ns>'") from None
            current = []
            continue
        fields = line.split()
        if not stamps:
            raise ValueError(f"line {lineno}: {line[:60]!r} before the first '@ <ns>' stamp")
        if not (fields[0].startswith("cpu") and fields[0][3:].isdigit()) or len(fields) < 1 + len(FIELDS):
            raise ValueError(f"line {lineno}: {line[:60]!r} is not a per-CPU /proc/stat line "
                             f"(cpuN and at least {len(FIELDS)} tick counts)")
        try:
            current.append((fields[0], [int(x) for x in fields[1:1 + len(FIELDS)]]))
        except ValueError:
            raise ValueError(f"line {lineno}: {line[:60]!r} has a tick count that is not an integer") from None
    close(len(text.splitlines()))
    ts = np.asarray(stamps, dtype=np.int64)
    if len(ts) > 1 and np.any(np.diff(ts) <= 0):
        raise ValueError("sample stamps are not increasing")
    ticks = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(cpus or ()), len(FIELDS))
    return CpuSamples(ts, tuple(cpus or ()), ticks)
