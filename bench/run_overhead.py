"""Benchmark: orchestration overhead per run and flow start skew on the netns lab, against a reference
measured in the same invocation.

Usage: sudo .venv/bin/python bench/run_overhead.py [--runs N] [--no-reference] [--reference-first]

Brings up its own netns lab (prefix: TCPLAB_TEST_PREFIX, else `tlbench`), runs the first N runs (default 8,
the whole plan) of experiments/quickstart.yaml (5 s runs, two captures, tcp_probe, qdisc stats) with
RunEngine.run_many into a throwaway SQLite database, then the same runs again as the reference: the fixed
margins tcplab used before it measured them (TCPLAB_FIXED_MARGINS=1: 2 s start margin, 1.2 s lead, passive
tasks stopped 1.5 s after the flows, each run ingested in series). Per run it prints the overhead (wall time
minus the flows' planned 5 s) and its phases, the packets each capture took and dropped, and whether every
flow's SYN, both FINs and the last ACK are in every capture (bench/capture_check.py); at the end the median
and max overhead of both, their ratio, and the start skew (M-STARTSKEW) p50/p99/max. The machine is shared:
the load average is printed with the figures. Takes the lab down.
The last line is: overhead: <median> s per run (median), reference <median> s, ratio <r>; skew p99 <ms> ms
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.capture_check import flow_ends  # noqa: E402
from orchestrator.engine.runner import RunEngine, RunOutcome  # noqa: E402
from orchestrator.inventory import Inventory, load_inventory  # noqa: E402
from orchestrator.lab import netns  # noqa: E402
from orchestrator.plan import expand, load_plan  # noqa: E402
from orchestrator.storage import tables as T  # noqa: E402
from orchestrator.storage.db import open_db  # noqa: E402

PLAN = ROOT / "experiments" / "quickstart.yaml"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextmanager
def own_netns_lab(default_prefix: str, tmp_prefix: str) -> Iterator[tuple[Inventory, Path]]:
    """A netns lab of the benchmark's own (prefix: TCPLAB_TEST_PREFIX, else default_prefix) and a temporary
    directory for its databases and results; the lab is taken down on the way out."""
    prefix = os.environ.get("TCPLAB_TEST_PREFIX", default_prefix)
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp:
        state = Path(tmp) / "lab"
        print(f"netns lab {prefix}: up (load {load()}, {os.cpu_count()} CPUs)", flush=True)
        netns.up(state, prefix)
        try:
            yield load_inventory(netns.inventory_path(state)), Path(tmp)
        finally:
            netns.down(state, prefix)


def capture_counts(results: Path, run_id: str) -> list[tuple[str, int, int]]:
    """(interface, captured, dropped by kernel + received but not written) of each capture of the run."""
    rec = json.loads((results / run_id / "ingest.json").read_text())
    out = []
    for infos in rec["artifacts"].values():
        for a in infos:
            if a["kind"] == "pcap":
                m = a["meta"]
                lost = m.get("dropped_by_kernel", 0) + max(0, m.get("received_by_filter", 0) - m.get("captured", 0))
                out.append((m.get("interface", "?"), m.get("captured", 0), lost))
    return out


def skews(db, run_ids: list[str]) -> list[float]:
    with db.connect() as conn:
        rows = conn.execute(sa.select(T.flow.c.run_id, T.flow.c.start_skew_ns)
                            .where(T.flow.c.run_id.in_(run_ids))).all()
    missing = [r.run_id for r in rows if r.start_skew_ns is None]
    if missing:
        print(f"  no start skew for a flow of {', '.join(sorted(set(missing)))}")
    return [r.start_skew_ns / 1e6 for r in rows if r.start_skew_ns is not None]


async def campaign(inv, db, results: Path, specs, label: str) -> list[RunOutcome]:
    print(f"\n== {label} ({len(specs)} runs), load {load()}", flush=True)

    def show(o: RunOutcome) -> None:
        caps = ", ".join(f"{i} {c} pkts {d} lost" for i, c, d in capture_counts(results, o.run_id))
        with db.connect() as conn:
            skew = [r.start_skew_ns for r in conn.execute(sa.select(T.flow.c.start_skew_ns)
                                                          .where(T.flow.c.run_id == o.run_id))]
        shown = " ".join(f"{v / 1e6:.1f}" if v is not None else "-" for v in skew)
        print(f"{o.run_id} {o.status}: {o.timing.line() if o.timing else '-'}\n    captures: {caps}; start skew ms: "
              f"{shown}", flush=True)

    async with RunEngine(inv, db, results) as engine:
        began = time.monotonic()
        outcomes = await engine.run_many([(s, None) for s in specs], show)
        wall = time.monotonic() - began
    ends = [e for o in outcomes for e in flow_ends(db, o.run_id)]
    incomplete = [e for e in ends if not e.complete]
    flows = sum(s.flows.__len__() for s in specs)
    print(f"campaign wall {wall:.1f} s for {len(specs)} x {specs[0].duration_s:g} s flows "
          f"({(wall - sum(o.timing.flows_s for o in outcomes if o.timing)) / len(specs):.2f} s per run including "
          f"the worker's start and the last ingest); flow ends (SYN, both FINs, last ACK) complete at "
          f"{len(ends) - len(incomplete)} of {len(ends)} (flow, capture point) pairs for {flows} flows"
          + "".join(f"\n  incomplete: {e}" for e in incomplete), flush=True)
    return outcomes


def summary(label: str, outcomes: list[RunOutcome], skew_ms: list[float]) -> tuple[float, float]:
    over = [o.timing.overhead_s for o in outcomes if o.timing]
    phases = sorted({k for o in outcomes if o.timing for k in o.timing.phases})
    med = {k: statistics.median(o.timing.phases.get(k, 0.0) for o in outcomes if o.timing) for k in phases}
    p = np.percentile(skew_ms, [50, 99]) if skew_ms else [float("nan")] * 2
    print(f"{label}: overhead median {statistics.median(over):.2f} s, max {max(over):.2f} s; median phases ms: "
          + " ".join(f"{k}={v * 1000:.0f}" for k, v in med.items() if k != "flows")
          + f"; start skew p50 {p[0]:.1f} ms, p99 {p[1]:.1f} ms, max {max(skew_ms, default=float('nan')):.1f} ms"
          f" ({len(skew_ms)} flows); flags: {sorted({f.guard for o in outcomes for f in o.flags})}")
    return statistics.median(over), float(p[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--reference-first", action="store_true")
    args = ap.parse_args()
    specs = expand(load_plan(PLAN))[: args.runs]
    with own_netns_lab("tlbench", "tcplab-overhead-") as (inv, tmp):
        modes = [("measured", "0"), ("reference (fixed margins, serial ingest)", "1")]
        if args.no_reference:
            modes = modes[:1]
        elif args.reference_first:
            modes.reverse()
        figures = {}
        try:
            for label, fixed in modes:
                os.environ["TCPLAB_FIXED_MARGINS"] = fixed
                db = open_db(f"sqlite:///{tmp}/{fixed}.db")
                outcomes = asyncio.run(campaign(inv, db, tmp / f"results-{fixed}", specs, label))
                figures[fixed] = summary(label, outcomes, skews(db, [o.run_id for o in outcomes]))
        finally:
            os.environ.pop("TCPLAB_FIXED_MARGINS", None)
    new, skew99 = figures["0"]
    ref = figures.get("1", (float("nan"), float("nan")))[0]
    print(f"load average at the end: {load()}")
    print(f"overhead: {new:.2f} s per run (median), reference {ref:.2f} s, ratio {new / ref:.2f}; "
          f"skew p99 {skew99:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
