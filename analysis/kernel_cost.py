"""M-KCOST: the per-function cost table of timing runs (docs/metrics.md#m-kcost), e.g. the Paced Chirping study's
pc-e10 and the timer-CC study's tb-e10/e11/e16: per cell (the runs of one configuration, repetitions pooled), host
and event: N, min, max, mean, sd, p99 of the durations (kprobe pairs: return - entry) or of the numbers that
trace_printk timing lines carry. Timing runs (G-PROBE) give this table and nothing else."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from analysis.metrics import PERCENTILE_METHOD
from analysis.tables import Table

COLUMNS = ("cell", "host", "source", "event", "unit", "n", "min", "max", "mean", "sd", "p99")


def is_timing_run(flags: Iterable[str]) -> bool:
    """A run flagged G-PROBE (it traced the kernel): its performance numbers are not reported."""
    return any(re.match(r"^(accepted )?G-PROBE\b", f) for f in flags)


def cell_of(run_id: str) -> str:
    """The run id without its repetition suffix: the runs of one configuration pool."""
    return re.sub(r"-r\d+$", "", run_id)


def cost_stats(values: np.ndarray) -> tuple[int, float, float, float, float | None, float]:
    """(N, min, max, mean, sd (sample, ddof 1; None for one value), p99) of one function's costs."""
    v = np.asarray(values, dtype=float)
    sd = float(v.std(ddof=1)) if len(v) > 1 else None
    return (len(v), float(v.min()), float(v.max()), float(v.mean()), sd,
            float(np.percentile(v, 99, method=PERCENTILE_METHOD)))


def cost_table(groups: dict[tuple[str, str, str, str], np.ndarray]) -> Table:
    """(cell, host, source, event) -> costs in ns -> the cost table (ns)."""
    rows = tuple((cell, host, source, event, "ns", *cost_stats(v))
                 for (cell, host, source, event), v in sorted(groups.items()) if len(v))
    return Table(name="kernel_cost", title="Kernel function cost (M-KCOST, timing runs, G-PROBE)", columns=COLUMNS,
                 rows=rows, note="kprobe: return - entry of each call (kprobe + kretprobe pair); printk: the number "
                 "of each `<name> ... <n> ns` trace_printk line; repetitions of a cell pooled")


def load_costs(engine: Engine, run_ids: Sequence[str]) -> dict[tuple[str, str, str, str], np.ndarray]:
    """The timed rows of kernel_trace for the runs (none when the database has no such table)."""
    if not run_ids:
        return {}
    with engine.connect() as conn:
        if "kernel_trace" not in sa.inspect(conn).get_table_names():
            return {}
        k = sa.table("kernel_trace", sa.column("run_id"), sa.column("host"), sa.column("source"),
                     sa.column("event"), sa.column("duration_ns"), sa.column("value"))
        stmt = (sa.select(k.c.run_id, k.c.host, k.c.source, k.c.event, sa.func.coalesce(k.c.duration_ns, k.c.value))
                .where(k.c.run_id.in_(list(run_ids)))
                .where(sa.or_(k.c.duration_ns.is_not(None), k.c.value.is_not(None))))
        lists: dict[tuple[str, str, str, str], list[float]] = {}
        for run_id, host, source, event, v in conn.execute(stmt):
            lists.setdefault((cell_of(run_id), host, source, event), []).append(float(v))
    return {key: np.array(v) for key, v in lists.items()}
