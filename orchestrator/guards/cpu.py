"""G-CPULOAD and M-CPU: the per-CPU load the hosts sampled during the run, over the run's analysis window.

A netns lab is one machine: every role that shares a kernel (same boot_id) shares one sampler, and the flag
names them all (`client+aqm+server`).
"""
from __future__ import annotations

import numpy as np

from orchestrator.ingest.cpu import CpuIntervals
from schemas.flag import Flag

CPULOAD_BUSY = 0.90        # G-CPULOAD: a core counts as saturated above 90 % busy (softirq and steal included)
CPULOAD_WINDOW_SHARE = 0.05   # ... and the run is flagged when that holds for more than 5 % of the window


def cpu_summary(load: CpuIntervals, window: tuple[int, int]) -> dict[str, dict[str, float]]:
    """M-CPU over the analysis window, per CPU: time-weighted mean busy, softirq and steal shares, the
    busiest interval, and the share of the window spent above CPULOAD_BUSY. Intervals without a tick are left
    out (their share of time is unknown)."""
    weight = load.overlap_ns(window).astype(np.float64)
    out = {}
    for i, cpu in enumerate(load.cpus):
        busy = load.busy[:, i]
        w = np.where(np.isnan(busy), 0.0, weight)
        if w.sum() == 0:
            continue
        out[cpu] = {"busy_mean": float(np.average(np.nan_to_num(busy), weights=w)),
                    "busy_max": float(np.nanmax(np.where(w > 0, busy, np.nan))),
                    "softirq_mean": float(np.average(np.nan_to_num(load.softirq[:, i]), weights=w)),
                    "steal_mean": float(np.average(np.nan_to_num(load.steal[:, i]), weights=w)),
                    "saturated_share": float(w[np.nan_to_num(busy) > CPULOAD_BUSY].sum() / w.sum())}
    return out


def cpuload_findings(summary: dict[str, dict[str, float]], host: str) -> list[Flag]:
    """G-CPULOAD: any core of a run's host > 90 % busy (incl. softirq) for > 5 % of the window. `host` names
    every role that shares that kernel (a netns lab is one machine)."""
    if not summary:
        return [Flag(guard="G-CPULOAD", host=host,
                     message="no CPU sample covers the analysis window: the host's load "
                        "during the run is unknown")]
    hot = {cpu: s for cpu, s in summary.items() if s["saturated_share"] > CPULOAD_WINDOW_SHARE}
    return [Flag(guard="G-CPULOAD", host=host,
                 message=f"{cpu} was > {CPULOAD_BUSY:.0%} busy for {s['saturated_share']:.0%} of "
                    f"the analysis window (mean {s['busy_mean']:.0%}, softirq {s['softirq_mean']:.0%}, "
                    f"steal {s['steal_mean']:.0%}): the lab host, not the network, may have limited this run")
            for cpu, s in hot.items()]


def kernel_groups(boot_ids: dict[str, str]) -> dict[str, list[str]]:
    """Roles grouped by the kernel they run on (same boot_id: one machine's CPUs, as in the netns lab),
    keyed by the group's first role. A role without a boot_id is its own group."""
    groups: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for role, boot in boot_ids.items():
        key = first.setdefault(boot, role) if boot else role
        groups.setdefault(key, []).append(role)
    return groups
