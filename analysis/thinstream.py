"""Thin-stream (app-limited) results: per flow, the writer's timing (M-WRITEGAP), what became of its writes
(M-APPLOSS) and the application-layer latencies (M-APPLAT, M-APPREAD), from the `app_write` table; the
report's table and latency CDF of them. Pure functions over arrays, plus one query (`load_app_writes`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.engine import Engine

from analysis.metrics.stats import PERCENTILE_METHOD, quantile_sketch
from analysis.tables import Table
from orchestrator.plan import RunSpec
from orchestrator.storage import tables

# agents/appwriter.py: the instant was reached more than half an interval late (a copy: the web layer, which
# imports the analysis, may not import the ingest)
SKIPPED = -2
LATE_FRACTION = 0.04    # a write made more than max(LATE_MIN_NS, 4 % of the interval) after its instant is late
LATE_MIN_NS = 1_000_000
APP_COLUMNS = ("flow_id", "write_index", "sched_ns", "t_ns", "stream_offset", "len", "accepted", "arrivals",
               "latency_ns", "read_latency_ns")
APP_DTYPE = np.dtype([(n, "i8") for n in APP_COLUMNS[:-2]] + [("latency_ns", "f8"), ("read_latency_ns", "f8")])


@dataclass(frozen=True)
class ThinStreamStats:
    """One app-limited flow. Intervals in ms between successive writes made (not skipped); latencies in ms."""

    run_id: str
    flow_id: int
    planned_interval_ms: float
    writes: int              # instants in the log
    made: int                # writes attempted (not skipped)
    skipped: int             # M-APPLOSS: instants skipped (writer more than half an interval late)
    late: int                # M-APPLOSS: made more than the late threshold after their instant
    unsent: int              # M-APPLOSS: made, but the socket took less than the write (send buffer full)
    lost: int                # M-APPLOSS: bytes taken, but their first byte never seen at the receiver side
    unobserved: int          # made before the receiver-side capture started and not seen: neither lost nor timed
    interval_mean_ms: float  # M-WRITEGAP
    interval_p50_ms: float
    interval_p99_ms: float
    interval_max_dev_ms: float   # largest |interval − planned| (fixed gaps only; NaN for exponential)
    lateness_max_ms: float   # largest t − scheduled instant
    latency_p50_ms: float    # M-APPLAT
    latency_p99_ms: float
    latency_max_ms: float
    read_latency_p50_ms: float   # M-APPREAD
    read_latency_p99_ms: float
    latency_sketch_ms: np.ndarray   # quantile sketch of M-APPLAT (the CDF)


def late_threshold_ns(planned_interval_ns: float) -> float:
    """M-APPLOSS's `late`: a write made more than this after its instant (max(LATE_MIN_NS, LATE_FRACTION of the
    planned or mean interval)); the writer guard (orchestrator/guards/appwrite.py) counts with it too."""
    return max(LATE_MIN_NS, LATE_FRACTION * planned_interval_ns)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q, method=PERCENTILE_METHOD)) if values.size else math.nan


def thin_stream_stats(run_id: str, flow_id: int, rows: np.ndarray, planned_interval_ns: int,
                      fixed: bool = True) -> ThinStreamStats:
    """The stats of one flow's APP_DTYPE rows (write order)."""
    made = rows[rows["accepted"] != SKIPPED]
    gaps_ms = np.diff(made["t_ns"]) / 1e6
    lateness = made["t_ns"] - made["sched_ns"]
    late_ns = late_threshold_ns(planned_interval_ns)
    taken = made[made["accepted"] > 0]
    lat = taken["latency_ns"][~np.isnan(taken["latency_ns"])] / 1e6
    read = taken["read_latency_ns"][~np.isnan(taken["read_latency_ns"])] / 1e6
    dev = float(np.abs(gaps_ms - planned_interval_ns / 1e6).max()) if fixed and gaps_ms.size else math.nan
    return ThinStreamStats(
        run_id=run_id, flow_id=flow_id, planned_interval_ms=planned_interval_ns / 1e6, writes=int(rows.size),
        made=int(made.size), skipped=int(rows.size - made.size), late=int((lateness > late_ns).sum()),
        unsent=int((made["accepted"] < made["len"]).sum()), lost=int((taken["arrivals"] == 0).sum()),
        unobserved=int((taken["arrivals"] < 0).sum()),
        interval_mean_ms=float(gaps_ms.mean()) if gaps_ms.size else math.nan,
        interval_p50_ms=_pct(gaps_ms, 50), interval_p99_ms=_pct(gaps_ms, 99), interval_max_dev_ms=dev,
        lateness_max_ms=float(lateness.max()) / 1e6 if lateness.size else math.nan,
        latency_p50_ms=_pct(lat, 50), latency_p99_ms=_pct(lat, 99),
        latency_max_ms=float(lat.max()) if lat.size else math.nan,
        read_latency_p50_ms=_pct(read, 50), read_latency_p99_ms=_pct(read, 99),
        latency_sketch_ms=quantile_sketch(lat) if lat.size else np.empty(0))


def load_app_writes(engine: Engine, run_id: str) -> dict[int, np.ndarray]:
    """flow_id -> its app_write rows (APP_DTYPE, write order; NULL latencies as NaN)."""
    t = tables.app_write
    stmt = select(*(t.c[n] for n in APP_COLUMNS)).where(t.c.run_id == run_id).order_by(t.c.flow_id,
                                                                                         t.c.write_index)
    with engine.connect() as conn:
        rows = [tuple(math.nan if v is None else v for v in r) for r in conn.execute(stmt)]
    arr = np.array(rows, dtype=APP_DTYPE) if rows else np.zeros(0, APP_DTYPE)
    return {int(f): arr[arr["flow_id"] == f] for f in np.unique(arr["flow_id"])}


def run_thin_streams(engine: Engine, run_id: str, spec: RunSpec | None) -> list[ThinStreamStats]:
    """The stats of every app-limited flow of one run."""
    flows = {f.flow_id: f for f in (spec.flows if spec is not None else []) if f.tool == "app_limited"}
    if not flows:
        return []
    out = []
    for flow_id, rows in load_app_writes(engine, run_id).items():
        f = flows.get(flow_id)
        if f is None or f.write_interval_s is None:
            continue
        out.append(thin_stream_stats(run_id, flow_id, rows, round(f.write_interval_s * 1e9),
                                     fixed=f.write_interval_dist is None))
    return out


TABLE_COLUMNS = ("run_id", "flow_id", "planned_interval_ms", "writes", "skipped", "late", "unsent", "lost",
                 "unobserved",
                 "interval_mean_ms", "interval_p50_ms", "interval_p99_ms", "interval_max_dev_ms",
                 "lateness_max_ms", "latency_p50_ms", "latency_p99_ms", "latency_max_ms",
                 "read_latency_p50_ms", "read_latency_p99_ms")


def thin_stream_table(stats: Sequence[ThinStreamStats]) -> Table:
    return Table("thin_streams", "Thin streams: write timing and application-layer latency", TABLE_COLUMNS,
                 tuple(tuple(getattr(s, c) for c in TABLE_COLUMNS) for s in stats),
                 "Per app-limited flow. Intervals between the writes made (M-WRITEGAP); skipped/late/unsent/lost "
                 "writes (M-APPLOSS); latency = first arrival of the write's first byte at the receiver-side "
                 "capture − write time (M-APPLAT); read latency = the sink's read of its last byte − write time "
                 "(M-APPREAD); ms, clock offsets removed.")


def latency_curves(stats: Sequence[ThinStreamStats], arms: dict[str, str]) -> dict[str, np.ndarray]:
    """CDF curves (quantile sketches) of M-APPLAT, labelled by run arm and flow."""
    return {f"{arms.get(s.run_id, s.run_id)} flow {s.flow_id}": s.latency_sketch_ms for s in stats
            if s.latency_sketch_ms.size}
