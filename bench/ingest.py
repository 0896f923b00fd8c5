"""Benchmark: tcplab read + ingest of a capture into PostgreSQL vs `tshark -T fields`, in one run.

Usage: .venv/bin/python bench/ingest.py [PCAP] [--packets N] [--tshark-count N] [--big] [--one-core CPU]
                                       [--pg URL]

Without PCAP it synthesises a realistic capture first (tests/support/synth.py: 16 bulk TCP
flows through a 600 Mbit/s bottleneck, full-size data segments with timestamps and ECN, one ACK per
two segments; N data packets, default 2,000,000 -> about 3 M packets). Then, measured in this run:
- tcplab: a child process streams the capture through the reader into a throwaway PostgreSQL
  database (created and dropped here; admin URL from --pg, TCPLAB_BENCH_PG, TCPLAB_TEST_PG or
  postgresql://postgres@127.0.0.1:5432/postgres) with write_run, i.e. read, conn ids, packet blocks, binary COPY
  into a new partition, BRIN index, attach and commit; packets/s and the child's peak RSS;
  also the CPU seconds of the ingest process and of its PostgreSQL backend (which bound the rate on
  a machine with spare cores), and the load average (other jobs share the cores);
- tshark reading the same fields to /dev/null. At ~30 k packets/s tshark would take minutes on the
  whole file, so it reads the first --tshark-count packets (default 200,000) and its rate is taken
  on that prefix (the output says so).
--one-core CPU pins the ingest process and its PostgreSQL backend to one CPU: the rate when both share
a single core (their CPU seconds add up) instead of running side by side on two.
--big additionally synthesises a >= 2 GB capture and reports the streaming ingest's peak RSS on it.
The last line is: ingest: <tcplab pkts/s> pkts/s, tshark <pkts/s> pkts/s, ratio <r>, rss <MB> MB
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TSHARK_FIELDS = ["frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport", "tcp.dstport",
                 "udp.srcport", "udp.dstport", "tcp.seq_raw", "tcp.ack_raw", "tcp.len", "udp.length", "ip.len",
                 "ipv6.plen", "tcp.flags", "ip.dsfield.ecn", "ipv6.tclass", "ip.id",
                 "tcp.options.timestamp.tsval", "tcp.options.timestamp.tsecr"]
ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
# the synthetic capture generator is test support (tests/support/synth.py), not part of the installed package:
# import it from this repository
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _admin_url(arg: str | None) -> str:
    return arg or os.environ.get("TCPLAB_BENCH_PG") or os.environ.get("TCPLAB_TEST_PG") or ADMIN_DEFAULT


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that over exec from the
    forking parent, which here holds the synthesised capture's generator state."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds(pid: int | str = "self") -> float:
    """utime + stime of a process on this host, from /proc (PostgreSQL backends are local here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ingest_child(pcap: Path, url: str, one_core: int | None = None) -> None:
    """Runs in a child process: one write_run of the capture; prints a JSON line with the numbers: wall
    time, and the CPU time of this process and of the PostgreSQL backend that did the COPY (where that
    time goes, whatever else the machine is running)."""
    from sqlalchemy import text

    from orchestrator.ingest.pcap import PcapReader, decoder_kind
    from orchestrator.storage.db import open_db
    from orchestrator.storage.run_ingest import RunIngest
    from orchestrator.storage.writer import write_run

    engine = open_db(url)
    with engine.connect() as conn:   # the pool hands this one connection to write_run
        backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
    if one_core is not None:   # this process, its COPY writer thread and its backend share one CPU
        os.sched_setaffinity(0, {one_core})
        os.sched_setaffinity(backend, {one_core})
    reader = PcapReader(pcap)
    run = {"run_id": "bench-0000", "plan_sha256": None, "plan_name": "bench", "experiment": "bench",
           "repetition": 0, "seed": 0, "status": "complete", "params": {}, "derived": {}, "spec": {},
           "tags": ["bench"], "t0_ns": None, "duration_s": 0.0, "started_at": dt.datetime.now(dt.UTC),
           "finished_at": None, "error": None, "flags": []}
    t, cpu, cpu_pg = time.perf_counter(), cpu_seconds(), cpu_seconds(backend)
    counts = write_run(engine, RunIngest(run=run, packets=[("bench:egress", reader)]))
    elapsed = time.perf_counter() - t
    cpu, cpu_pg = cpu_seconds() - cpu, cpu_seconds(backend) - cpu_pg
    engine.dispose()
    print(json.dumps({"packets": counts.packet, "seconds": elapsed, "conns": counts.conn,
                      "rss_mb": peak_rss_mb(), "cpu_s": cpu, "cpu_pg_s": cpu_pg, "decoder": decoder_kind(),
                      "records": reader.stats.records if reader.stats else None}))


def run_ingest(pcap: Path, admin: str, one_core: int | None = None) -> dict:
    """Create a throwaway database, ingest into it in a child process, drop it; the child's numbers."""
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"tcplab_bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(admin).set(drivername="postgresql+psycopg", database=name)
        argv = [sys.executable, __file__, "--child", str(pcap), "--pg", url.render_as_string(hide_password=False)]
        out = subprocess.run(argv + (["--one-core", str(one_core)] if one_core is not None else []),
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_tshark(pcap: Path, count: int) -> tuple[float, int] | None:
    """(packets/s, packets read) of tshark -T fields on the first `count` packets, or None."""
    if shutil.which("tshark") is None:
        return None
    argv = ["tshark", "-n", "-r", str(pcap), "-c", str(count), "-T", "fields",
            *[a for f in TSHARK_FIELDS for a in ("-e", f)]]
    t = time.perf_counter()
    with open(os.devnull, "wb") as null:
        subprocess.run(argv, stdout=null, stderr=subprocess.DEVNULL, check=True)
    elapsed = time.perf_counter() - t
    return count / elapsed, count


def synthesise(path: Path, data_packets: int) -> float:
    from tests.support.synth import write_bottleneck_pcap

    t = time.perf_counter()
    write_bottleneck_pcap(path, data_packets)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pcap", nargs="?", type=Path)
    p.add_argument("--packets", type=int, default=2_000_000, help="data packets to synthesise (no PCAP)")
    p.add_argument("--tshark-count", type=int, default=200_000)
    p.add_argument("--big", action="store_true", help="also measure RSS on a synthetic >= 2 GB capture")
    p.add_argument("--pg", help="PostgreSQL admin URL (throwaway databases are created there)")
    p.add_argument("--one-core", type=int, metavar="CPU",
                   help="pin the ingest process and its PostgreSQL backend to this one CPU (needs root)")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        ingest_child(args.child, args.pg, args.one_core)
        return
    admin = _admin_url(args.pg)
    with tempfile.TemporaryDirectory(prefix="tcplab-bench-") as tmp:
        pcap = args.pcap
        if pcap is None:
            pcap = Path(tmp) / "synthetic.pcap"
            took = synthesise(pcap, args.packets)
            print(f"synthesised {pcap.stat().st_size / 1e6:,.0f} MB ({args.packets:,} data packets + ACKs) "
                  f"in {took:.1f} s")
        res = run_ingest(pcap, admin, args.one_core)
        ours = res["packets"] / res["seconds"]
        print(f"tcplab: {res['packets']:,} packets ({res['conns']} conns) read and written to PostgreSQL in "
              f"{res['seconds']:.2f} s: {ours:,.0f} pkts/s, child peak RSS {res['rss_mb']:.0f} MB")
        print(f"  CPU: ingest process {res['cpu_s']:.2f} s ({res['decoder']} decoder), PostgreSQL backend "
              f"{res['cpu_pg_s']:.2f} s (alone that would allow {res['packets'] / max(res['cpu_pg_s'], 1e-9):,.0f} "
              f"rows/s); load average {os.getloadavg()[0]:.1f}")
        ts = run_tshark(pcap, min(args.tshark_count, res["packets"]))
        if ts is None:
            theirs_s, ratio_s = "n/a (tshark not installed)", "n/a"
        else:
            theirs, n = ts
            print(f"tshark -T fields ({len(TSHARK_FIELDS)} fields) to /dev/null on the first {n:,} packets: "
                  f"{theirs:,.0f} pkts/s")
            theirs_s, ratio_s = f"{theirs:.0f}", f"{ours / theirs:.1f}"
        rss = res["rss_mb"]
        if args.big:
            big = Path(tmp) / "big.pcap"
            took = synthesise(big, 17_500_000)
            size = big.stat().st_size
            print(f"big: synthesised {size / 2**30:.2f} GiB in {took:.0f} s")
            res_big = run_ingest(big, admin)
            print(f"big: {res_big['packets']:,} packets in {res_big['seconds']:.1f} s "
                  f"({res_big['packets'] / res_big['seconds']:,.0f} pkts/s), peak RSS {res_big['rss_mb']:.0f} MB")
            big.unlink()
            rss = max(rss, res_big["rss_mb"])
        print(f"ingest: {ours:.0f} pkts/s, tshark {theirs_s} pkts/s, ratio {ratio_s}, rss {rss:.0f} MB")


if __name__ == "__main__":
    main()
