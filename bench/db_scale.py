"""Benchmark: the PostgreSQL result database at campaign scale (1,000 runs, 100 M packets) and its two queries.

Usage: .venv/bin/python bench/db_scale.py [--runs N] [--packets N] [--pg URL] [--keep]

Creates a throwaway database (admin URL from --pg, TCPLAB_BENCH_PG, TCPLAB_TEST_PG or
postgresql://postgres@127.0.0.1:5432/postgres), fills it through the real writer (write_run: conn ids, packet
blocks and qdelay rows by binary COPY into per-run partitions, attach) with synthetic but realistic runs:
one template run synthesised once with tests/support/synth.py (16 bulk TCP flows through a 600 Mbit/s
bottleneck, captured at the aqm's ingress and egress, read by the real pcap reader, per-packet queue delay
paired by orchestrator/ingest/qdelay.py), shifted in time for every run, with plans, statuses, flags and
specs that vary. Then it times, cold (a new connection, first execution, after the query's relations were
dropped from the OS page cache with posix_fadvise: those files only) and warm (median of 5):
- the run list: one page of runs with plan, status and flags, newest first (what a run list page and
  `tcplab table` ask for), target < 1 s; and analysis.load.list_runs (all complete runs, with specs);
- a run's queue-delay percentiles (p50/p90/p99 of qdelay.sojourn_ns of one run), target < 2 s;
- a run's packets through the `packet` view and through packet_store's numpy read-back (for reference),
with EXPLAIN (ANALYZE, BUFFERS) summaries that show partition pruning and index use. The database is
dropped at the end, also on failure or Ctrl-C (unless --keep). Disk use is printed before and after.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from orchestrator.storage.db import PG_SESSION_OPTIONS
from orchestrator.storage.tables import PARTITION_SCHEMA

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:   # the synthetic capture generator is test support, not installed
    sys.path.insert(0, str(REPO_ROOT))

ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGET_RUN_LIST_S, TARGET_QDELAY_S = 1.0, 2.0
PAGE = 50
RUN_LIST_SQL = (
    "SELECT r.run_id, r.plan_name, p.path AS plan_path, r.experiment, r.repetition, r.status, r.flags, r.tags, "
    "r.started_at, r.duration_s FROM run r LEFT JOIN plan p ON p.plan_sha256 = r.plan_sha256 "
    f"ORDER BY r.started_at DESC LIMIT {PAGE} OFFSET %(offset)s")
PERCENTILES = "percentile_disc(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY q.sojourn_ns), count(*)"
# as one statement (what a `tcplab query` user writes: pruned at run time) and as the loaders ask (analysis/load.py
# resolves the run_key first, so the planner prunes to one partition)
QDELAY_SQL = (f"SELECT {PERCENTILES} FROM qdelay q "
              "WHERE q.run_key = (SELECT run_key FROM run WHERE run_id = %(run_id)s) AND q.dropped = 0")
QDELAY_BY_KEY_SQL = f"SELECT {PERCENTILES} FROM qdelay q WHERE q.run_key = %(key)s AND q.dropped = 0"
PACKET_VIEW_SQL = (
    "SELECT count(*), sum(p.payload_len) FROM packet p "
    "WHERE p.run_key = (SELECT run_key FROM run WHERE run_id = %(run_id)s)")
console = Console()


def admin_url(arg: str | None) -> str:
    return arg or os.environ.get("TCPLAB_BENCH_PG") or os.environ.get("TCPLAB_TEST_PG") or ADMIN_DEFAULT


# --- the synthetic runs ------------------------------------------------------------------------------

class Template:
    """One synthesised run: egress and ingress packets of 16 flows and the ingress data packets' pairing."""

    def __init__(self, packets_per_run: int, tmp: Path) -> None:
        from orchestrator.ingest.pcap import read_pcap
        from orchestrator.storage import records
        from tests.support.synth import write_bottleneck_pcap

        data = max(1, packets_per_run // 3)   # each capture: data + one ACK per two segments = 1.5 x data
        egress, ingress = tmp / "egress.pcap", tmp / "ingress.pcap"
        write_bottleneck_pcap(egress, data, ingress_path=ingress, seed=1)
        self.points = ("aqm:to-client", "aqm:to-server")
        self.egress, self.ingress = read_pcap(egress), read_pcap(ingress)
        self.span_ns = int(self.egress["ts_ns"][-1] - self.egress["ts_ns"][0])
        tcp_data = (self.ingress["payload_len"] > 0) & (self.ingress["proto"] == records.PROTO_TCP)
        self.ingress_data = self.ingress[tcp_data]
        self.packets = self.egress.size + self.ingress.size

    def ingest(self, index: int, started: dt.datetime, plans: list[dict]) -> object:
        from orchestrator.ingest.qdelay import pair
        from orchestrator.storage.conns import ConnRegistry
        from orchestrator.storage.run_ingest import RunIngest

        rng = np.random.default_rng(index)
        shift = index * (self.span_ns + 60_000_000_000)
        ingress, egress, ingress_data = (replace_ts(a, shift) for a in (self.ingress, self.egress, self.ingress_data))
        conns = ConnRegistry()
        ingress_data["point"] = 1                     # the ingress is the run's second capture point
        result = pair(ingress_data, egress, conns.ids(ingress_data))
        plan, aqm = plans[index % len(plans)], ("fq_codel", "pie", "red")[index % 3]
        status = status_of(index)
        flags = [{"guard": "G-CPULOAD", "host": "aqm", "message": "cpu1 was > 90% busy for 12% of the window",
                  "evidence": {"share": 0.12}}] if rng.random() < 0.2 else []
        run = {"run_id": f"{plan['name']}-e{index % 7}-{index:05x}-r{index % 5}", "plan_sha256": plan["plan_sha256"],
               "plan_name": plan["name"], "experiment": f"e{index % 7}", "repetition": index % 5, "seed": index,
               "status": status, "params": {"rate": "600mbit", "flows": 16, "aqm": aqm},
               "derived": {"bdp_bytes": 3_000_000, "netem_limit": 10_000}, "spec": synthetic_spec(index),
               "tags": ["scale"], "t0_ns": int(egress["ts_ns"][0]), "duration_s": self.span_ns / 1e9,
               "started_at": started, "finished_at": started + dt.timedelta(seconds=40),
               "error": "agent lost" if status == "failed" else None, "flags": flags}
        flows = [{"flow_id": f, "src_host": "server", "dst_host": "client", "src_addr": "10.0.3.2",
                  "dst_addr": "10.0.1.2", "src_port": None, "dst_port": 5201 + f, "cc": "cubic", "start_s": 0.0,
                  "duration_s": 40.0, "tool": "iperf3"} for f in range(16)]
        if status == "refused":
            return RunIngest(run=run, plan=plan, flows=flows)
        return RunIngest(run=run, plan=plan, flows=flows, packets=[(self.points[0], egress), (self.points[1], ingress)],
                         conns=conns, qdelay=[(self.points[1], result.rows)],
                         qdelay_pairs=[result.summary(self.points[1], self.points[0])])


def status_of(index: int) -> str:
    """About 1 % of the runs refused (no packets) and 4 % failed, spread over the campaign."""
    return "refused" if index % 97 == 13 else "failed" if index % 23 == 5 else "complete"


def replace_ts(arr: np.ndarray, shift_ns: int) -> np.ndarray:
    out = arr.copy()
    out["ts_ns"] += shift_ns
    return out


def synthetic_spec(index: int) -> dict:
    """A RunSpec-sized JSON document (hosts with sysctls and qdisc chains, flows): a few kB, like real ones."""
    hosts = {role: {"kernel": {"name": "vanilla-6.1", "build_key": None},
                    "sysctls": {f"net.ipv4.tcp_opt_{i}": str(i * index % 7) for i in range(40)},
                    "qdiscs": {"to-client": [{"kind": "htb", "rate_bit": 600_000_000, "burst": 75_000},
                                             {"kind": "fq_codel", "target_ns": 5_000_000, "interval_ns": 100_000_000}]}}
             for role in ("client", "aqm", "server")}
    return {"run_id": f"r{index}", "duration_s": 40.0, "hosts": hosts,
            "flows": [{"src": "server", "dst": "client", "cc": "cubic", "port": 5201 + f} for f in range(16)]}


def plan_rows(count: int) -> list[dict]:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [{"plan_sha256": f"{i:064x}", "name": f"scale{i}", "path": f"experiments/scale{i}.yaml",
             "text": f"name: scale{i}\n", "created_at": now} for i in range(count)]


def fill(engine: object, runs: int, template: Template) -> tuple[float, int]:
    """Write `runs` runs; returns (seconds, packets written)."""
    from orchestrator.storage.writer import write_run

    plans, packets = plan_rows(max(1, runs // 50)), 0
    start, t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("writing runs", total=runs, rate="")
        for i in range(runs):
            counts = write_run(engine, template.ingest(i, start + dt.timedelta(minutes=i), plans))
            packets += counts.packet
            rate = packets / (time.perf_counter() - t0)
            progress.update(task, advance=1, rate=f"{packets / 1e6:,.1f} M packets, {rate / 1e6:.2f} M packets/s")
            if not console.is_terminal and (i + 1) % max(1, runs // 10) == 0:   # a log file gets a line per 10 %
                console.print(f"{i + 1:,} runs, {packets / 1e6:,.1f} M packets, {rate / 1e6:.2f} M packets/s, "
                              f"load average {os.getloadavg()[0]:.1f}")
    return time.perf_counter() - t0, packets


# --- timing ------------------------------------------------------------------------------------------

def evict(url: str, relations: list[str]) -> int:
    """Drop the files of `relations` (with their TOAST tables and indexes) from the OS page cache
    (posix_fadvise DONTNEED), so the next read of them comes from disk: a cold read of these files only,
    nothing else on the shared machine. Returns the files evicted (0 where the data directory is not
    readable from here, e.g. a remote server)."""
    import psycopg

    sql = ("SELECT pg_relation_filepath(o) FROM unnest(%(oids)s::regclass[]) AS o "
           "UNION SELECT pg_relation_filepath(c.reltoastrelid) FROM pg_class c "
           "WHERE c.oid = ANY(%(oids)s::regclass[]) AND c.reltoastrelid <> 0 "
           "UNION SELECT pg_relation_filepath(i.indexrelid) FROM pg_index i "
           "WHERE i.indrelid = ANY(%(oids)s::regclass[])")
    with psycopg.connect(url) as conn:
        datadir = Path(conn.execute("SELECT current_setting('data_directory')").fetchone()[0])
        files = [f for (rel,) in conn.execute(sql, {"oids": relations}).fetchall()
                 for f in datadir.glob(rel + "*")]
    evicted = 0
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            evicted += 1
        finally:
            os.close(fd)
    return evicted


def timed(url: str, sql: str, params: dict, relations: list[str], repeat: int = 5) -> tuple[float, float, list, int]:
    """(cold, warm median seconds, the answer, files evicted): cold is the first execution on a new connection
    after `relations` were dropped from the OS page cache (the probed runs are early ones, long gone from
    PostgreSQL's shared buffers by the time the fill ends)."""
    import psycopg

    evicted = evict(url, relations)
    with psycopg.connect(url, options=PG_SESSION_OPTIONS) as conn:   # as tcplab's sessions (open_db, query)
        t = time.perf_counter()
        rows = conn.execute(sql, params).fetchall()
        cold = time.perf_counter() - t
        warm = []
        for _ in range(repeat):
            t = time.perf_counter()
            conn.execute(sql, params).fetchall()
            warm.append(time.perf_counter() - t)
    return cold, statistics.median(warm), rows, evicted


def explain(url: str, sql: str, params: dict) -> list[str]:
    """The lines of EXPLAIN (ANALYZE, BUFFERS) that show pruning, scans, index use, buffers and times; the
    partitions pruned at run time (never executed) are counted, not listed."""
    import psycopg

    keep = ("Subplans Removed", "Scan", "Buffers", "Planning Time", "Execution Time", "Limit", "Sort Method")
    with psycopg.connect(url, options=PG_SESSION_OPTIONS) as conn:
        plan = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()]
    never = sum("never executed" in line for line in plan)
    lines = [line.rstrip() for line in plan if any(k in line for k in keep) and "never executed" not in line]
    return lines + ([f"({never} partition scans never executed: pruned at run time)"] if never else [])


def numpy_read(engine: object, run_id: str) -> tuple[float, int]:
    from analysis.load import load_packets

    with engine.connect() as conn:
        t = time.perf_counter()
        key = conn.exec_driver_sql("SELECT run_key FROM run WHERE run_id = %(r)s", {"r": run_id}).scalar_one()
        pkts = load_packets(conn, key, "aqm:to-client")
        return time.perf_counter() - t, pkts.size


def report(url: str, engine: object, probes: list[str]) -> None:
    """Time the queries; each run-level query probes a different early run, so its cold read is its own."""
    import psycopg

    from analysis.load import list_runs

    with psycopg.connect(url) as conn:
        keys = [conn.execute("SELECT run_key FROM run WHERE run_id = %s", (r,)).fetchone()[0] for r in probes]
    part = PARTITION_SCHEMA
    table = Table(title=f"queries (load average {os.getloadavg()[0]:.1f})")
    for col in ("query", "run", "cold s", "warm s", "target", "answer"):
        table.add_column(col)
    explains = {}
    for name, probe, sql, params, relations, target in (
            ("run list, first page", "", RUN_LIST_SQL, {"offset": 0}, ["run", "plan"], TARGET_RUN_LIST_S),
            ("run list, page 10", "", RUN_LIST_SQL, {"offset": 9 * PAGE}, ["run", "plan"], TARGET_RUN_LIST_S),
            ("qdelay p50/p90/p99 of one run", probes[0], QDELAY_SQL, {"run_id": probes[0]},
             [f"{part}.qdelay_{keys[0]}"], TARGET_QDELAY_S),
            ("  the same, run_key first", probes[1], QDELAY_BY_KEY_SQL, {"key": keys[1]},
             [f"{part}.qdelay_{keys[1]}"], TARGET_QDELAY_S),
            ("one run's packets via the view", probes[2], PACKET_VIEW_SQL, {"run_id": probes[2]},
             [f"{part}.packet_block_{keys[2]}"], None)):
        cold, warm, rows, evicted = timed(url, sql, params, relations)
        verdict = "" if target is None else f"< {target:g} s " + ("met" if max(cold, warm) < target else "MISSED")
        answer = f"{len(rows)} rows" if len(rows) != 1 else str(rows[0])[:60]
        table.add_row(name, probe, f"{cold:.3f}" + ("" if evicted else " (cache kept)"), f"{warm:.3f}", verdict,
                      answer)
        explains[name] = explain(url, sql, params)
    with psycopg.connect(url) as conn:   # the server's defaults, JIT on: what tcplab's sessions avoid
        t = time.perf_counter()
        conn.execute(QDELAY_SQL, {"run_id": probes[0]}).fetchall()
        table.add_row("qdelay percentiles, one statement, server default jit=on", probes[0],
                      f"{time.perf_counter() - t:.3f}", "", "(not tcplab's sessions)", "")
    with engine.connect() as conn:
        t = time.perf_counter()
        metas = list_runs(conn)
        took = time.perf_counter() - t
    table.add_row("analysis.load.list_runs (all complete runs, specs)", "", f"{took:.3f}", "", "", f"{len(metas)} runs")
    evict(url, [f"{part}.packet_block_{keys[0]}"])
    took, n = numpy_read(engine, probes[0])
    table.add_row("load_packets of one run (packet_store, numpy)", probes[0], f"{took:.3f}", "", "",
                  f"{n:,} data packets")
    console.print(table)
    for name, lines in explains.items():
        console.print(f"[bold]EXPLAIN (ANALYZE, BUFFERS): {name}[/bold]")
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def drop(admin: str, name: str) -> None:
    """DROP DATABASE ... WITH (FORCE), again while a cancelled backend (parallel workers) is still exiting."""
    import psycopg

    for attempt in range(12):
        try:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            console.print(f"dropped database {name}")
            return
        except psycopg.errors.ObjectInUse:
            if attempt == 11:
                raise
            time.sleep(5)


def main(argv: list[str] | None = None) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    from orchestrator.storage.db import open_db

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1_000)
    p.add_argument("--packets", type=int, default=100_000_000, help="packets in all runs together")
    p.add_argument("--pg", help="PostgreSQL admin URL (the throwaway database is created there)")
    p.add_argument("--keep", action="store_true", help="do not drop the database (prints its name)")
    args = p.parse_args(argv)
    admin = admin_url(args.pg)
    usage = shutil.disk_usage("/work" if Path("/work").exists() else "/")
    console.print(f"disk before: {usage.free / 2**30:,.1f} GiB free of {usage.total / 2**30:,.1f} GiB; "
                  f"load average {os.getloadavg()[0]:.1f}")
    name = f"tcplab_scale_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = None
    try:
        url = make_url(admin).set(drivername="postgresql+psycopg", database=name)
        libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
        engine = open_db(url.render_as_string(hide_password=False))
        with tempfile.TemporaryDirectory(prefix="tcplab-scale-") as tmp:
            t = time.perf_counter()
            with_packets = sum(1 for i in range(args.runs) if status_of(i) != "refused")
            template = Template(-(-args.packets // max(1, with_packets)), Path(tmp))
            took = time.perf_counter() - t
            console.print(f"template run: {template.packets:,} packets at 2 capture points, "
                          f"{template.ingress_data.size:,} queue-delay rows, synthesised in {took:.1f} s")
        took, packets = fill(engine, args.runs, template)
        with psycopg.connect(libpq) as conn:
            size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
            conn.execute("ANALYZE run")
        console.print(f"filled: {args.runs:,} runs, {packets:,} packets in {took:.0f} s "
                      f"({packets / took / 1e6:.2f} M packets/s with qdelay rows); database {size / 2**30:.2f} GiB; "
                      f"load average {os.getloadavg()[0]:.1f}")
        with engine.connect() as conn:   # early runs: long gone from PostgreSQL's shared buffers
            probes = list(conn.exec_driver_sql("SELECT run_id FROM run WHERE status = 'complete' ORDER BY run_key "
                                               "OFFSET 10 LIMIT 3").scalars())
        report(libpq, engine, probes)
    finally:
        if engine is not None:
            engine.dispose()
        if args.keep:
            console.print(f"kept database {name}")
        else:
            drop(admin, name)
        usage = shutil.disk_usage("/work" if Path("/work").exists() else "/")
        console.print(f"disk after: {usage.free / 2**30:,.1f} GiB free")


if __name__ == "__main__":
    main()
