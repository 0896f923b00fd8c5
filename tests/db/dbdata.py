"""Realistic result data for the DB tests: RunIngest builders and DB content readers.

Arrays mimic real captures (two flows, IPv4 and IPv6, 32-bit sequence numbers, missing TCP
timestamps as -1); readers use plain SELECTs, independent of the code under test.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
from sqlalchemy import Engine, func, select, text

from orchestrator.ingest import applat
from orchestrator.ingest.applog import parse_write_log
from orchestrator.ingest.pcap import read_pcap
from orchestrator.ingest.ss import parse_ss
from orchestrator.storage import addr, records, tables
from orchestrator.storage.conns import ConnRegistry
from orchestrator.storage.run_ingest import IngestCounts, RunIngest

PLAN_SHA = "a" * 64
T0_NS = 1_732_170_000_000_000_000
POINTS = ("client:to-aqm", "aqm:to-server")


def packets(n: int, rng: np.random.Generator, t0_ns: int = T0_NS) -> np.ndarray:
    """n packets of two flows (IPv4 and IPv6) with strictly increasing timestamps."""
    a = np.zeros(n, records.PACKET)
    a["ts_ns"] = t0_ns + np.cumsum(rng.integers(1_000, 120_000, n))
    v6 = rng.random(n) < 0.3
    a["ipv"] = np.where(v6, 6, 4)
    a["proto"] = np.where(rng.random(n) < 0.05, records.PROTO_UDP, records.PROTO_TCP)
    a["src_addr"] = np.where(v6, addr.packed("fd00:0:0:1::2"), addr.packed("10.0.1.2"))
    a["dst_addr"] = np.where(v6, addr.packed("fd00:0:0:3::2"), addr.packed("10.0.3.2"))
    a["src_port"] = np.where(v6, 40_001, 40_000)
    a["dst_port"] = np.where(v6, 5_202, 5_201)
    a["seq"] = rng.integers(0, 2**32, n)
    a["ack"] = rng.integers(0, 2**32, n)
    a["payload_len"] = rng.choice([0, 1448], n)
    a["ip_len"] = a["payload_len"] + 52
    a["tcp_flags"] = rng.choice([0x10, 0x18, 0x02, 0x12, 0x11], n)
    a["ecn"] = rng.integers(0, 4, n)
    a["ip_id"] = rng.integers(0, 65_536, n)
    a["tsval"] = np.where(rng.random(n) < 0.05, -1, rng.integers(0, 2**32, n))
    a["tsecr"] = np.where(a["tsval"] < 0, -1, rng.integers(0, 2**32, n))
    return a


def qdelays(n: int, rng: np.random.Generator) -> np.ndarray:
    a = np.zeros(n, records.QDELAY)
    a["conn_id"] = rng.integers(0, 2, n)
    a["ts_in_ns"] = T0_NS + np.cumsum(rng.integers(1_000, 120_000, n))
    a["dropped"] = rng.random(n) < 0.01
    a["sojourn_ns"] = np.where(a["dropped"], -1, rng.integers(0, 5_000_000, n))
    a["ts_out_ns"] = np.where(a["dropped"], -1, a["ts_in_ns"] + a["sojourn_ns"] + 15_000)
    a["payload_len"] = 1448
    a["ce"] = (rng.random(n) < 0.02) & (a["dropped"] == 0)
    return a


def tcp_probes(n: int, rng: np.random.Generator) -> np.ndarray:
    a = np.zeros(n, records.TCP_PROBE)
    a["ts_ns"] = T0_NS + np.cumsum(rng.integers(10_000, 2_000_000, n))
    a["saddr"], a["sport"], a["daddr"], a["dport"] = "10.0.1.2", 40_000, "10.0.3.2", 5_201
    a["snd_cwnd"] = rng.integers(10, 2_000, n)
    a["ssthresh"] = 2_147_483_647
    a["srtt_us"] = rng.integers(20_000, 80_000, n)
    a["snd_wnd"] = a["rcv_wnd"] = 3_145_728
    a["snd_nxt"] = rng.integers(0, 2**32, n)
    a["snd_una"] = a["snd_nxt"] - 1448
    a["data_len"] = 1448
    a["sock_cookie"] = 2**62 + 7  # cookies use the full 64 bits
    return a


def qdisc_samples(n: int, rng: np.random.Generator) -> np.ndarray:
    a = np.zeros(n, records.QDISC_SAMPLE)
    a["ts_ns"] = T0_NS + np.arange(n, dtype=np.int64) * 10_000_000
    a["handle"], a["parent"], a["kind"] = "1:", "root", "fq_codel"
    a["packets"] = np.cumsum(rng.integers(0, 900, n))
    a["bytes"] = a["packets"] * 1500
    a["drops"] = np.cumsum(rng.integers(0, 2, n))
    a["backlog_bytes"] = rng.integers(0, 300_000, n)
    a["qlen"] = a["backlog_bytes"] // 1500
    return a


def iperf_intervals(n: int, rng: np.random.Generator, port: int) -> np.ndarray:
    a = np.zeros(n, records.IPERF_INTERVAL)
    a["stream_port"] = port
    a["start_s"] = np.arange(n) * 0.1
    a["end_s"] = a["start_s"] + 0.1
    a["bytes"] = rng.integers(1_000_000, 2_000_000, n)
    a["bits_per_second"] = a["bytes"] * 80.0
    a["retransmits"] = rng.integers(0, 5, n)
    a["snd_cwnd"] = rng.integers(14_480, 2_000_000, n)
    a["rtt_us"] = rng.integers(20_000, 80_000, n)
    return a


SS_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ss"


def ss_samples() -> np.ndarray:
    """Real `ss -tinH` polls (bbr data socket + bbr control socket, 18 rows) and the DCTCP rows (alpha
    512/1024, and fallback mode): every NULL pattern the table has."""
    return np.concatenate([parse_ss((SS_FIXTURES / name).read_text())
                           for name in ("ss_bbr.txt", "ss_dctcp_constructed.txt")])


def app_writes() -> np.ndarray:
    """records.APP_WRITE rows of the real thin-stream fixture (tests/fixtures/app: a capture that wraps past 0
    and loses packets): latencies set, no sink log, so every read column is NULL."""
    fix = Path(__file__).resolve().parents[1] / "fixtures" / "app"
    pk = read_pcap(fix / "wrap.pcap")
    data = pk[pk["src_port"] == 47004]
    isn, _ = applat.isn_of(data["seq"], data["tcp_flags"], data["payload_len"])
    return applat.app_writes(parse_write_log((fix / "wrap-writer.bin").read_bytes()).rows, data, isn, None, (0, 0, 0))


def run_row(run_id: str, status: str = "complete", plan_sha256: str | None = PLAN_SHA) -> dict:
    return {
        "run_id": run_id, "plan_sha256": plan_sha256, "plan_name": "quickstart", "experiment": "fq_codel",
        "repetition": 0, "seed": 42, "status": status,
        "params": {"aqm": "fq_codel", "rtt_ms": 40}, "derived": {"bdp_bytes": 500_000},
        "spec": {"run_id": run_id, "duration_s": 30.0}, "tags": ["smoke"], "t0_ns": T0_NS,
        "duration_s": 30.0, "started_at": dt.datetime(2024, 11, 21, 6, 0, tzinfo=dt.UTC),
        "finished_at": dt.datetime(2024, 11, 21, 6, 1, tzinfo=dt.UTC), "error": None, "flags": [],
    }


def plan_row(sha: str = PLAN_SHA, path: str = "experiments/quickstart.yaml") -> dict:
    return {"plan_sha256": sha, "name": "quickstart", "path": path, "text": "name: quickstart\n",
            "created_at": dt.datetime(2024, 11, 21, 5, 0, tzinfo=dt.UTC)}


def make_run_ingest(run_id: str = "quickstart-0000", n_packets: int = 100_000, seed: int = 1,
                    status: str = "complete", plan: dict | None = None) -> RunIngest:
    """A run shaped like a real one: 2 flows, 2 capture points, tcp_probe, 2 qdisc pollers, ss, iperf."""
    rng = np.random.default_rng(seed)
    half = n_packets // 2
    flows = [{"flow_id": i, "src_host": "client", "dst_host": "server", "src_addr": src,
              "dst_addr": dst, "src_port": 40_000 + i, "dst_port": 5_201 + i, "cc": cc,
              "start_s": 0.0, "duration_s": 30.0, "tool": "iperf3"}
             for i, (src, dst, cc) in enumerate([("10.0.1.2", "10.0.3.2", "cubic"),
                                                  ("fd00:0:0:1::2", "fd00:0:0:3::2", "bbr")])]
    return RunIngest(
        run=run_row(run_id, status, PLAN_SHA),
        plan=plan if plan is not None else plan_row(),
        flows=flows,
        artifacts=[{"host": h, "name": f"{h}.pcap", "kind": "pcap", "path": f"artifacts/{h}.pcap",
                    "size": 123_456, "sha256": "b" * 64, "meta": {"snaplen": 128}}
                   for h in ("client", "aqm")],
        evidence=[{"host": h, "phase": p, "data": {"kernel": "6.1.0", "sysctls": {"net.core.x": "1"}}}
                  for h in ("client", "aqm", "server") for p in ("hello", "apply")],
        hosts=[{"host": h, "variant": "vanilla-6.1", "vanilla": True, "build_key": None, "release": "6.1.0-50-amd64",
                "boot_id": f"{i:08x}-0000-4000-8000-000000000000", "installed_build_key": None}
               for i, h in enumerate(("client", "aqm", "server"))],
        packets=[(POINTS[0], packets(half, rng)), (POINTS[1], packets(n_packets - half, rng))],
        conns=ConnRegistry(),
        qdelay=[(POINTS[0], qdelays(n_packets // 10, rng))],
        qdelay_pairs=[{"ingress": POINTS[0], "egress": POINTS[1], "d_fwd_ns": 15_000, "d_fwd_source": "given",
                       "netem_ns": 0, "matched": 1, "dropped": 0, "ce": 0, "unmatched_egress": 0}],
        tcp_probe=[("client", tcp_probes(3_000, rng))],
        qdisc_samples=[("aqm", "veth-srv", qdisc_samples(1_000, rng)),
                       ("aqm", "veth-cli", qdisc_samples(1_000, rng))],
        ss_samples=[("client", ss_samples())],
        iperf_intervals=[(0, iperf_intervals(300, rng, 40_000)), (1, iperf_intervals(300, rng, 40_001))],
        app_writes=[(1, app_writes())],
    )


# Every table as SQL reads it on both backends: `packet` is a table on SQLite and a view on PostgreSQL, whose
# storage (packet_block) is left out.
READABLE_TABLES = [t for t in tables.metadata.sorted_tables if t is not tables.packet_block]


def table_counts(engine: Engine, run_id: str | None = None) -> dict[str, int]:
    """Rows per table of plans and runs (of one run, or all), read with plain SQL independent of the writer;
    tables write_run does not write (kernel_build, the campaign tables) are left out."""
    out = {}
    with engine.connect() as conn:
        for t in READABLE_TABLES:
            if t.name not in IngestCounts.__dataclass_fields__:   # campaign tables, kernel_build
                continue
            stmt = select(func.count()).select_from(t)
            if run_id is not None and "run_id" in t.c:
                stmt = stmt.where(t.c.run_id == run_id)
            elif run_id is not None and "run_key" in t.c:
                key = select(tables.run.c.run_key).where(tables.run.c.run_id == run_id).scalar_subquery()
                stmt = stmt.where(t.c.run_key == key)
            out[t.name] = conn.scalar(stmt)
    return out


def snapshot(engine: Engine) -> dict[str, list[tuple]]:
    """Every row of every table, sorted: equality means the DB content is identical."""
    with engine.connect() as conn:
        return {t.name: sorted(tuple(map(repr, r)) for r in conn.execute(select(t))) for t in READABLE_TABLES}


PACKET_COLUMNS = ("point", "proto", "ipv", "src_addr", "dst_addr", "src_port", "dst_port",
                  *records.PACKET_VALUE_FIELDS)


def packets_back(engine: Engine, run_id: str) -> list[tuple]:
    """A run's packets as stored (conn joined back in), sorted; plain SQL, independent of the writer."""
    cols = ", ".join(f"c.{c}" if c in ("point", "proto", "ipv", "src_addr", "dst_addr", "src_port", "dst_port")
                     else f"p.{c}" for c in PACKET_COLUMNS)
    sql = (f"SELECT {cols} FROM packet p JOIN run r ON r.run_key = p.run_key "
           "JOIN conn c ON c.run_key = p.run_key AND c.conn_id = p.conn_id WHERE r.run_id = :r")
    with engine.connect() as conn:
        return sorted(tuple(row) for row in conn.execute(text(sql), {"r": run_id}))


def packets_expected(ingest: RunIngest) -> list[tuple]:
    """What packets_back should return for a RunIngest whose packets are arrays."""
    out = []
    for point, arr in ingest.packets:
        src = addr.format_column(arr["ipv"], arr["src_addr"])
        dst = addr.format_column(arr["ipv"], arr["dst_addr"])
        cols = [arr[c].tolist() for c in ("proto", "ipv")] + [src.tolist(), dst.tolist()]
        cols += [arr[c].tolist() for c in ("src_port", "dst_port", *records.PACKET_VALUE_FIELDS)]
        out += [(point, *row) for row in zip(*cols, strict=True)]
    return sorted(out)
