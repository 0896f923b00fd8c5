"""Benchmark: what rate each local lab sustains through a 3-host chain, UML vs TCG vs netns in one invocation.

Usage: sudo .venv/bin/python bench/lab_rate.py [--labs uml,vm,netns] [--rates 50,200,500,1000] [--flows 1,4]
                                                [--duration 8] [--no-netem]

For each lab kind it brings up its own lab (prefix `tlrate<kind>`, own state dir), runs one cell per rate and
flow count: CUBIC from server to client through htb at the rate (+ netem 10 ms in front of it where the lab's
kernel has netem; the netns lab's kernel has none, so its runs have no delay, said in the table), offloads off,
a capture on both sides of the aqm, and stores the runs in a throwaway SQLite database. Per run it prints the
goodput over the run's analysis window (from the aqm's egress capture; iperf3's own figure without captures),
goodput / (rate x 1448/1514) -- the share of what TCP can carry over Ethernet framing at that rate,
so 1.00 is a full link -- and the guards the run carries. Each lab is taken down before the next.
The VM lab is the hybrid one (the aqm a TCG guest, the endpoints namespaces): three TCG guests on two cores
forward far less, and that is not what it would be used for. The load average is printed with the figures.
The last line is: lab-rate: <kind> <rate>x<flows> <share>, ... for every run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from analysis.summary import run_table  # noqa: E402
from orchestrator.engine.plan_run import run_plan  # noqa: E402
from orchestrator.lab import netns, uml, vm  # noqa: E402
from orchestrator.storage.db import open_db  # noqa: E402
from schemas.flag import Flag  # noqa: E402

WIRE = 1448 / 1514


def plan_text(rates: list[int], flows: list[int], duration: int, netem: bool, captures: bool = True) -> str:
    delay = "    delay: 10ms\n    line_rate: 10gbit\n" if netem else ""
    capture = "" if captures else "  captures: []\n"
    return f"""
version: 1
name: lab-rate
description: cubic through htb at each rate{' + netem 10 ms' if netem else ''}, 1 and 4 flows
roles: [client, aqm, server]
tags: [smoke]
repetitions: 1
seed: 1
run:
  duration: {duration}s
  mtu: 1500
  bottleneck:
    at: {{host: aqm, toward: client}}
    rate: {rates[0]}mbit
{delay}    queue: {{kind: pfifo, limit: 1000}}
  traffic: {{tool: iperf3, src: server, dst: client, cc: cubic, flows: 1, base_port: 5201}}
  hosts:
    all:
      offloads: {{tso: off, gso: off, gro: off}}
      sysctls:
        net.ipv4.tcp_no_metrics_save: 1
        net.ipv4.tcp_rmem: "4096 131072 33554432"
        net.ipv4.tcp_wmem: "4096 131072 33554432"
  tcp_probe: false
{capture}  analysis: {{warmup: 2s}}
  accept_guards: [G-NETEM]
matrix:
  axes:
    bottleneck.rate: [{', '.join(f'{r}mbit' for r in rates)}]
    traffic.flows: [{', '.join(str(f) for f in flows)}]
"""


def window_goodput(db, run_id: str) -> float | None:
    """The run's goodput over its analysis window, from the packets the aqm's egress capture holds (what the
    run table reports); None without that capture."""
    rows = run_table(db, [run_id])
    value = rows[0].goodput_bps if rows else None
    return value if value is not None and value == value and value > 0 else None


def lab_up(kind: str, state: Path, prefix: str) -> dict:
    if kind == "uml":
        return uml.up(state, prefix, timeout_s=180)
    if kind == "vm":
        return vm.up(state, prefix, vm_roles=("aqm",), timeout_s=240)
    return netns.up(state, prefix)


def lab_down(kind: str, state: Path, prefix: str) -> None:
    {"uml": uml.down, "vm": vm.down}.get(kind, netns.down)(state, prefix)


def measure(kind: str, args: argparse.Namespace, work: Path) -> list[tuple]:
    prefix, state = f"tlrate{kind}", work / f"state-{kind}"
    netem = kind != "netns" and not args.no_netem
    plan = work / f"lab-rate-{kind}.yaml"
    plan.write_text(plan_text(args.rates, args.flows, args.duration, netem, not args.no_captures))
    started = time.monotonic()
    try:
        lab_up(kind, state, prefix)
        up_s = time.monotonic() - started
        url = f"sqlite:///{work / f'{kind}.db'}"
        with open(os.devnull, "w") as quiet:
            asyncio.run(run_plan(plan, db_url=url, inventory=netns.inventory_path(state), results=work / f"res-{kind}",
                                 force=False, console=Console(file=quiet),
                                 progress_factory=lambda: Progress(disable=True)))
    finally:
        lab_down(kind, state, prefix)
    db = open_db(url)
    with db.connect() as conn:
        runs = conn.execute(sa.text("SELECT run_id, spec, flags, status, error FROM run ORDER BY run_id")).all()
        rows = []
        for r in runs:
            spec = json.loads(r.spec) if isinstance(r.spec, str) else r.spec
            rate = spec["derived"].get("bottleneck_rate_bit")
            goodput = window_goodput(db, r.run_id) if r.status == "complete" else None
            if goodput is None:   # no capture to take the analysis window from: iperf3's own figure
                goodput = conn.execute(sa.text("SELECT sum(goodput_bps) FROM v_flow WHERE run_id = :r"),
                                       {"r": r.run_id}).scalar_one()
            flags = json.loads(r.flags) if isinstance(r.flags, str) else r.flags
            guards = sorted({Flag.from_stored(f).guard for f in flags if not Flag.from_stored(f).accepted})
            rows.append((kind, rate, len(spec["flows"]), goodput, r.status, guards, netem))
            if r.status != "complete":
                print(f"{kind}: {r.run_id} {r.status}: {(r.error or '').splitlines()[:3]}", flush=True)
    print(f"{kind}: lab up {up_s:.1f} s; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labs", default="uml,vm,netns")
    p.add_argument("--rates", default="50,200,500,1000", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--flows", default="1,4", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--duration", type=int, default=8)
    p.add_argument("--no-netem", action="store_true", help="htb only on every lab")
    p.add_argument("--no-captures", action="store_true",
                   help="no tcpdump on the aqm (the default captures both sides of it, as the studies do)")
    args = p.parse_args()
    print(f"lab_rate: load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lab-rate-") as tmp:
        for kind in args.labs.split(","):
            rows += measure(kind, args, Path(tmp))
    print(f"{'lab':6} {'rate':>9} {'flows':>5} {'goodput':>12} {'share':>6}  guards")
    summary = []
    for kind, rate, flows, goodput, status, guards, netem in rows:
        if goodput is None:
            print(f"{kind:6} {(rate or 0) / 1e6:>6.0f} Mb {flows:>5} {status:>12}")
            continue
        share = goodput / (rate * WIRE)
        print(f"{kind:6} {rate / 1e6:>6.0f} Mb {flows:>5} {goodput / 1e6:>8.1f} Mb/s {share:>6.3f}  "
              f"{' '.join(guards) or '-'}{'' if netem else '  (no netem)'}")
        summary.append(f"{kind} {rate / 1e6:.0f}x{flows} {share:.2f}")
    print("lab-rate: " + ", ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
