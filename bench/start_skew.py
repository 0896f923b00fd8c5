"""Benchmark: flow start skew (M-STARTSKEW) of iperf3 flows against `bulk` flows, measured in the same runs on
the netns lab.

Usage: sudo .venv/bin/python bench/start_skew.py [--runs N]

Brings up its own netns lab (prefix: TCPLAB_TEST_PREFIX, else `tlskew`) and runs tests/plans/lab_bulk_start.yaml
without its background group as two experiments, N repetitions each (default 5), interleaved: 4 `bulk` flows
alone, and the same 4 flows with tool iperf3 alone (from one host at T0 through a 40 Mbit/s htb, 4 s runs),
with RunEngine.run_many into a throwaway SQLite database. Apart, so that neither tool's flows queue behind the
other's at the bottleneck before they start. Each flow's skew is its first data packet at the aqm's interface
facing the sender minus T0 (both in the manager's clock). Prints per run the skews, then per tool p50, p99 and
max of the skew and of the spread (latest minus earliest start of one run's flows), and the ratio of the
iperf3 p99 of |skew| to the bulk one. The machine is shared: the load average is printed with the figures. Takes the
lab down.
The last line is: |start skew| p99: bulk <ms> ms, iperf3 <ms> ms (ratio <r>); spread p99 bulk <ms> ms
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.run_overhead import load, own_netns_lab  # noqa: E402
from orchestrator.engine.runner import RunEngine, RunOutcome  # noqa: E402
from orchestrator.plan import expand, load_plan_text  # noqa: E402
from orchestrator.storage import tables as T  # noqa: E402
from orchestrator.storage.db import open_db  # noqa: E402

PLAN = ROOT / "tests" / "plans" / "lab_bulk_start.yaml"
TOOLS = ("bulk", "iperf3")
APART = """
experiments:
  - name: bulk-alone
    set: {background: []}
  - name: iperf3-alone
    set: {traffic.tool: iperf3, background: []}
"""


def run_skews(db, run_id: str) -> dict[str, list[float]]:
    """tool -> the start skews (ms) of the run's flows of that tool (a flow without one is reported)."""
    with db.connect() as conn:
        rows = conn.execute(sa.select(T.flow.c.tool, T.flow.c.flow_id, T.flow.c.start_skew_ns)
                            .where(T.flow.c.run_id == run_id).order_by(T.flow.c.flow_id)).all()
    out: dict[str, list[float]] = {t: [] for t in TOOLS}
    for r in rows:
        if r.start_skew_ns is None:
            print(f"  {run_id}: flow {r.flow_id} has no start skew")
        else:
            out.setdefault(r.tool, []).append(r.start_skew_ns / 1e6)
    return out


def stats(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return (float("nan"),) * 3
    p50, p99 = np.percentile(values, [50, 99])
    return float(p50), float(p99), float(max(values))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    text = PLAN.read_text().replace("repetitions: 1", f"repetitions: {args.runs}") + APART
    specs = expand(load_plan_text(text, str(PLAN)))
    skew: dict[str, list[float]] = {t: [] for t in TOOLS}
    spread: dict[str, list[float]] = {t: [] for t in TOOLS}
    with own_netns_lab("tlskew", "tcplab-skew-") as (inv, tmp):
        db = open_db(f"sqlite:///{tmp}/skew.db")

        def show(o: RunOutcome) -> None:
            per = run_skews(db, o.run_id)
            print(f"{o.run_id} {o.status} (load {load()}): "
                  + "; ".join(f"{t} " + " ".join(f"{v:.3f}" for v in per.get(t, [])) for t in TOOLS)
                  + f" ms; flags {sorted({f.guard for f in o.flags})}"
                  + "".join(f"\n    {f}" for f in o.flags if f.guard != "G-CPULOAD"), flush=True)
            for t in TOOLS:
                skew[t] += per.get(t, [])
                if per.get(t):
                    spread[t].append(max(per[t]) - min(per[t]))

        async def go() -> None:
            async with RunEngine(inv, db, tmp / "results") as engine:
                await engine.run_many([(s, None) for s in specs], show)

        asyncio.run(go())
    print(f"load average at the end: {load()}")
    print(report(skew, spread))
    return 0


def report(skew: dict[str, list[float]], spread: dict[str, list[float]]) -> str:
    """The figures per tool, then the last line (module docstring)."""
    lines = []
    for t in TOOLS:
        s, w = stats(skew[t]), stats(spread[t])
        lines.append(f"{t}: start skew p50 {s[0]:.3f} ms, p99 {s[1]:.3f} ms, max {s[2]:.3f} ms ({len(skew[t])} "
                     f"flows); spread in a run p50 {w[0]:.3f} ms, p99 {w[1]:.3f} ms, max {w[2]:.3f} ms "
                     f"({len(spread[t])} runs)")
    # the ratio of the p99 of |skew|: a bulk flow may start a little before T0 as the clocks measure it
    bulk, iperf = (stats([abs(v) for v in skew[t]])[1] for t in TOOLS)
    lines.append(f"|start skew| p99: bulk {bulk:.3f} ms, iperf3 {iperf:.3f} ms (ratio {iperf / bulk:.0f}); "
                 f"spread p99 bulk {stats(spread['bulk'])[1]:.3f} ms")
    return "\n".join(lines)

if __name__ == "__main__":
    sys.exit(main())
