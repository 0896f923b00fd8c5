"""The result database schema (SQLAlchemy Core), one definition for SQLite and PostgreSQL.

Alembic migrations under orchestrator/storage/migrations create exactly these tables. Per-packet
tables (packet, tcp_probe, qdisc_sample, iperf_interval) carry run_id and are replaced as a whole when
a run is re-ingested; their column names equal the fields of orchestrator/ingest/records.py.
"""
from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)

metadata = MetaData()

plan = Table(
    "plan", metadata,
    Column("plan_sha256", String(64), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("path", Text, nullable=False),
    Column("text", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

run = Table(
    "run", metadata,
    Column("run_id", String(128), primary_key=True),
    Column("plan_sha256", String(64), ForeignKey("plan.plan_sha256"), nullable=True),
    Column("plan_name", String(200), nullable=False),
    Column("experiment", String(200), nullable=False),
    Column("repetition", Integer, nullable=False),
    Column("seed", BigInteger, nullable=False),
    Column("status", String(20), nullable=False),          # complete | failed
    Column("params", JSON, nullable=False),
    Column("derived", JSON, nullable=False),
    Column("spec", JSON, nullable=False),                  # the whole RunSpec
    Column("tags", JSON, nullable=False),                  # e.g. ["smoke"] for netns/VM labs (G-VM)
    Column("t0_ns", BigInteger, nullable=True),
    Column("duration_s", Float, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("error", Text, nullable=True),
    Column("flags", JSON, nullable=False),                 # guard findings after the run
)

flow = Table(
    "flow", metadata,
    Column("run_id", String(128), ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
    Column("flow_id", Integer, primary_key=True),
    Column("src_host", String(64), nullable=False),
    Column("dst_host", String(64), nullable=False),
    Column("src_addr", String(45), nullable=False),
    Column("dst_addr", String(45), nullable=False),
    Column("src_port", Integer, nullable=True),            # sender's data-stream port (from iperf3)
    Column("dst_port", Integer, nullable=False),
    Column("cc", String(32), nullable=False),
    Column("start_s", Float, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("tool", String(32), nullable=False),
)

artifact = Table(
    "artifact", metadata,
    Column("run_id", String(128), ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
    Column("host", String(64), primary_key=True),
    Column("name", String(200), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("path", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("meta", JSON, nullable=False),
)

host_evidence = Table(
    "host_evidence", metadata,
    Column("run_id", String(128), ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
    Column("host", String(64), primary_key=True),
    Column("phase", String(32), primary_key=True),         # hello | apply | reset
    Column("data", JSON, nullable=False),
)

packet = Table(
    "packet", metadata,
    Column("run_id", String(128), nullable=False, index=False),
    Column("point", String(100), nullable=False),          # capture point, e.g. aqm:to-client
    Column("ts_ns", BigInteger, nullable=False),
    Column("src_addr", String(45), nullable=False),
    Column("dst_addr", String(45), nullable=False),
    Column("src_port", Integer, nullable=False),
    Column("dst_port", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("ack", BigInteger, nullable=False),
    Column("payload_len", Integer, nullable=False),
    Column("ip_len", Integer, nullable=False),
    Column("tcp_flags", SmallInteger, nullable=False),
    Column("ecn", SmallInteger, nullable=False),
    Column("ip_id", Integer, nullable=False),
    Column("tsval", BigInteger, nullable=False),
    Column("tsecr", BigInteger, nullable=False),
)

tcp_probe = Table(
    "tcp_probe", metadata,
    Column("run_id", String(128), nullable=False),
    Column("host", String(64), nullable=False),
    Column("ts_ns", BigInteger, nullable=False),           # CLOCK_REALTIME (converted from trace clock)
    Column("saddr", String(45), nullable=False),
    Column("sport", Integer, nullable=False),
    Column("daddr", String(45), nullable=False),
    Column("dport", Integer, nullable=False),
    Column("snd_cwnd", BigInteger, nullable=False),
    Column("ssthresh", BigInteger, nullable=False),
    Column("srtt_us", BigInteger, nullable=False),
    Column("snd_wnd", BigInteger, nullable=False),
    Column("rcv_wnd", BigInteger, nullable=False),
    Column("snd_nxt", BigInteger, nullable=False),
    Column("snd_una", BigInteger, nullable=False),
    Column("data_len", Integer, nullable=False),
    Column("sock_cookie", BigInteger, nullable=False),
)

qdisc_sample = Table(
    "qdisc_sample", metadata,
    Column("run_id", String(128), nullable=False),
    Column("host", String(64), nullable=False),
    Column("interface", String(64), nullable=False),
    Column("ts_ns", BigInteger, nullable=False),
    Column("handle", String(16), nullable=False),
    Column("parent", String(16), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("packets", BigInteger, nullable=False),
    Column("drops", BigInteger, nullable=False),
    Column("overlimits", BigInteger, nullable=False),
    Column("requeues", BigInteger, nullable=False),
    Column("backlog_bytes", BigInteger, nullable=False),
    Column("qlen", BigInteger, nullable=False),
)

iperf_interval = Table(
    "iperf_interval", metadata,
    Column("run_id", String(128), nullable=False),
    Column("flow_id", Integer, nullable=False),
    Column("stream_port", Integer, nullable=False),
    Column("start_s", Float, nullable=False),
    Column("end_s", Float, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("bits_per_second", Float, nullable=False),
    Column("retransmits", BigInteger, nullable=False),
    Column("snd_cwnd", BigInteger, nullable=False),
    Column("rtt_us", BigInteger, nullable=False),
)

# Bulk tables are read and deleted per run; packet is also read per capture point in time order (queue
# delay pairs two points), so its index leads with run_id and serves per-run deletes as well.
Index("ix_packet_run_point_ts", packet.c.run_id, packet.c.point, packet.c.ts_ns)
Index("ix_tcp_probe_run_id", tcp_probe.c.run_id)
Index("ix_qdisc_sample_run_id", qdisc_sample.c.run_id)
Index("ix_iperf_interval_run_id", iperf_interval.c.run_id)

PER_RUN_BULK_TABLES = (packet, tcp_probe, qdisc_sample, iperf_interval)
