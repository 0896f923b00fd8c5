"""The result database schema (SQLAlchemy Core), one definition for SQLite and PostgreSQL.

Alembic migrations under orchestrator/storage/migrations create exactly these tables. The per-packet
tables carry the run's integer `run_key` instead of its text id; on PostgreSQL they are LIST-partitioned by
run_key (PARTITIONED_TABLES: one partition per run, in schema PARTITION_SCHEMA, created at ingest and dropped
on re-ingest; the migration adds PARTITION BY, which SQLAlchemy metadata cannot express), on SQLite they are
plain tables. Packets refer to `conn` (one row per direction of a 5-tuple at a capture point) instead of
repeating point, protocol, addresses and ports. PostgreSQL stores packets in blocks (`packet_block`) and
shows them one row per packet through the view `packet`; SQLite has the `packet` table
(orchestrator/storage/packet_store.py; `in_schema` says which table exists where). Layout choices and
numbers: docs/ingest.md.
"""
from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
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
    Column("status", String(20), nullable=False),          # complete | failed | refused
    Column("params", JSON, nullable=False),
    Column("derived", JSON, nullable=False),
    Column("spec", JSON, nullable=False),                  # the whole RunSpec
    Column("tags", JSON, nullable=False),                  # e.g. ["smoke"] for netns/VM labs (G-VM)
    Column("profile", String(64), nullable=True),          # the testbed profile the run was adapted with
    Column("t0_ns", BigInteger, nullable=True),
    Column("duration_s", Float, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("error", Text, nullable=True),
    Column("flags", JSON, nullable=False),                 # guard findings after the run
    Column("run_key", Integer, nullable=False, unique=True),  # small id used by the per-packet tables
    # provenance (orchestrator/engine/provenance.py, docs/database.md): who ran it, where, with which code and plan
    Column("run_by", String(64), nullable=True),            # TCPLAB_USER, else the manager's OS user
    Column("testbed", String(128), nullable=True),          # TCPLAB_TESTBED, else <inventory kind>:<manager host>
    Column("tcplab_version", String(64), nullable=True),    # the installed package's version
    Column("tcplab_commit", String(64), nullable=True),     # git describe of the tcplab checkout, else the version
    Column("plan_commit", String(64), nullable=True),       # commit of the plan's repository (+"-dirty"); NULL: no git
    Column("timing", JSON, nullable=True),                 # phase timings and overhead (engine/timing.py)
)

kernel_build = Table(
    "kernel_build", metadata,                              # tcplab kernel build (orchestrator/kernel/)
    Column("build_key", String(64), primary_key=True),     # sha256 of the pinned inputs and the toolchain
    Column("variant", String(64), nullable=False),
    Column("release", String(128), nullable=False),        # uname -r of the build (LOCALVERSION carries the key)
    Column("source", Text, nullable=False),                # e.g. debian-package linux-source-6.1 6.1.192-2
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("metadata", JSON, nullable=False),              # the cache entry's metadata.json
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
    Column("ack_ratio", Float, nullable=True),             # M-ACKRATIO: data segments per pure ACK (G-ACK)
    Column("scheduled_start_ns", BigInteger, nullable=True),   # T0 + start_s (the manager's clock)
    Column("measured_start_ns", BigInteger, nullable=True),    # the flow's first data packet, in the manager's clock
    Column("start_skew_ns", BigInteger, nullable=True),        # M-STARTSKEW: measured - scheduled
    Column("start_point", String(128), nullable=True),         # the capture point the first data packet was taken from
    # a `bulk` flow, from its sink's read log (orchestrator/ingest/bulkflows.py): bytes read, their goodput
    # from the scheduled start, and a byte-limited flow's completion time (M-FCT from the scheduled start)
    Column("sink_bytes", BigInteger, nullable=True),
    Column("sink_goodput_bps", Float, nullable=True),
    Column("fct_ns", BigInteger, nullable=True),
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

run_host = Table(
    # what kernel each host ran the run on (docs/kernels.md, G-VARIANT): the variant the plan asked for, the
    # tcplab build it expected, and what the host's agent reported at hello (release, boot_id, installed build)
    "run_host", metadata,
    Column("run_id", String(128), ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
    Column("host", String(64), primary_key=True),
    Column("variant", String(64), nullable=True),          # None: the plan names no kernel for this host
    Column("vanilla", Boolean, nullable=True),
    Column("build_key", String(64), nullable=True),        # the tcplab build the run expected (source variants)
    Column("release", String(128), nullable=True),         # uname -r reported at hello
    Column("boot_id", String(36), nullable=True),          # /proc/sys/kernel/random/boot_id at hello
    Column("installed_build_key", String(64), nullable=True),  # what kernel-install.yml recorded on the host
    Column("os_system", String(32), nullable=True),        # the agent's OS at hello: Linux (G-HETERO)
    Column("os_id", String(64), nullable=True),            # /etc/os-release ID: debian
    Column("os_version_id", String(64), nullable=True),    # /etc/os-release VERSION_ID: 12
)

run_event = Table(
    # timed plan events as the agent performed them (docs/plans.md "Events", docs/ingest.md): scheduled
    # (T0 + at), effective (the change command returned: in force from then on), lag = effective - scheduled
    "run_event", metadata,
    Column("run_id", String(128), ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
    Column("event_index", Integer, primary_key=True),       # the event's index in the run's `events`
    Column("action", String(32), nullable=False),           # set_delay | set_loss | set_rate | ack_blackout | ...
    Column("host", String(64), nullable=False),
    Column("interface", String(64), nullable=True),         # None for stop_flows
    Column("scheduled_ns", BigInteger, nullable=False),
    Column("issued_ns", BigInteger, nullable=True),
    Column("effective_ns", BigInteger, nullable=True),      # None: the action failed (detail says why)
    Column("lag_ns", BigInteger, nullable=True),
    Column("end_scheduled_ns", BigInteger, nullable=True),  # ack_blackout: the window's end
    Column("end_effective_ns", BigInteger, nullable=True),
    Column("detail", JSON, nullable=False),                 # the parameter, argv, read-back after the change
)

capture_point = Table(
    "capture_point", metadata,
    Column("run_id", String(128), ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
    Column("point_id", SmallInteger, primary_key=True),
    Column("point", String(100), nullable=False),           # e.g. aqm:to-client
    Column("host", String(64), nullable=True),
    Column("interface", String(64), nullable=True),
    Column("records", BigInteger, nullable=False),          # reader counts (orchestrator/ingest/pcap.py)
    Column("tcp", BigInteger, nullable=False),
    Column("udp", BigInteger, nullable=False),
    Column("other", BigInteger, nullable=False),
    Column("truncated", BigInteger, nullable=False),
    Column("trailing_bytes", BigInteger, nullable=False),
    Column("captured", BigInteger, nullable=True),           # tcpdump's own counts (NULL if unknown)
    Column("received_by_filter", BigInteger, nullable=True),
    Column("dropped_by_kernel", BigInteger, nullable=True),
)

conn = Table(
    "conn", metadata,
    Column("run_key", Integer, ForeignKey("run.run_key", ondelete="CASCADE"), primary_key=True),
    Column("conn_id", Integer, primary_key=True),
    Column("point", String(100), nullable=False),
    Column("proto", SmallInteger, nullable=False),         # 6 TCP, 17 UDP
    Column("ipv", SmallInteger, nullable=False),           # 4 or 6
    Column("src_addr", String(45), nullable=False),
    Column("dst_addr", String(45), nullable=False),
    Column("src_port", Integer, nullable=False),
    Column("dst_port", Integer, nullable=False),
)

packet = Table(
    "packet", metadata,
    Column("run_key", Integer, nullable=False),
    Column("conn_id", Integer, nullable=False),
    Column("ts_ns", BigInteger, nullable=False),
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

# PostgreSQL: up to packet_store.BLOCK_PACKETS consecutive packets of one conn, packed (packet_store.RECORD)
packet_block = Table(
    "packet_block", metadata,
    Column("run_key", Integer, nullable=False),
    Column("conn_id", Integer, nullable=False),
    Column("block_no", Integer, nullable=False),           # write order within the run
    Column("packets", SmallInteger, nullable=False),
    Column("ts_first_ns", BigInteger, nullable=False),
    Column("ts_last_ns", BigInteger, nullable=False),
    Column("rec", LargeBinary, nullable=False),            # packets x 56 bytes, big-endian records
)

qdelay = Table(
    "qdelay", metadata,
    Column("run_key", Integer, nullable=False),
    Column("conn_id", Integer, nullable=False),            # conn at the aqm ingress
    Column("ts_in_ns", BigInteger, nullable=False),
    Column("ts_out_ns", BigInteger, nullable=True),        # NULL: dropped
    Column("sojourn_ns", BigInteger, nullable=True),       # t_out - t_in - d_fwd - netem; NULL: dropped
    Column("payload_len", Integer, nullable=False),
    Column("ce", SmallInteger, nullable=False),            # CE-marked between ingress and egress
    Column("dropped", SmallInteger, nullable=False),
)

qdelay_pair = Table(
    "qdelay_pair", metadata,
    Column("run_id", String(128), ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
    Column("ingress", String(100), primary_key=True),
    Column("egress", String(100), primary_key=True),
    Column("d_fwd_ns", BigInteger, nullable=False),        # subtracted forwarding latency
    Column("d_fwd_source", String(32), nullable=False),    # run-minimum | given
    Column("netem_ns", BigInteger, nullable=False),        # subtracted emulated delay on the path
    Column("matched", BigInteger, nullable=False),
    Column("dropped", BigInteger, nullable=False),
    Column("ce", BigInteger, nullable=False),
    Column("unmatched_egress", BigInteger, nullable=False),  # at egress but never at ingress
)

tcp_probe = Table(
    "tcp_probe", metadata,
    Column("run_key", Integer, nullable=False),
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
    Column("run_key", Integer, nullable=False),
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

# `ss -tinH` samples on the senders (orchestrator/ingest/ss.py): one row per socket per poll. Rates in
# bit/s, times in µs, dctcp_alpha as a fraction 0..1 (the kernel's alpha / DCTCP_MAX_ALPHA = 1024).
# NULL where ss did not report a value (ssthresh before the first loss, DCTCP/BBR fields of other CCs).
ss_sample = Table(
    "ss_sample", metadata,
    Column("run_key", Integer, nullable=False),
    Column("host", String(64), nullable=False),
    Column("ts_ns", BigInteger, nullable=False),           # CLOCK_REALTIME, middle of the poll
    Column("saddr", String(45), nullable=False),
    Column("sport", Integer, nullable=False),
    Column("daddr", String(45), nullable=False),
    Column("dport", Integer, nullable=False),
    Column("cc", String(16), nullable=False),
    *(Column(c, BigInteger, nullable=False) for c in ("cwnd", "mss", "bytes_sent", "bytes_retrans", "bytes_acked",
                                                       "unacked", "lost", "delivered", "delivered_ce")),
    Column("ssthresh", BigInteger, nullable=True),
    Column("rtt_us", BigInteger, nullable=True),
    Column("rttvar_us", BigInteger, nullable=True),
    Column("minrtt_us", BigInteger, nullable=True),
    Column("delivery_rate_bit", BigInteger, nullable=True),
    Column("pacing_rate_bit", BigInteger, nullable=True),
    Column("retrans", BigInteger, nullable=False),         # unacknowledged retransmitted segments now
    Column("retrans_total", BigInteger, nullable=False),   # retransmissions over the socket's life
    Column("dctcp_alpha", Float, nullable=True),           # fraction 0..1
    Column("dctcp_ab_ecn", BigInteger, nullable=True),
    Column("dctcp_ab_tot", BigInteger, nullable=True),
    Column("bbr_bw_bit", BigInteger, nullable=True),
    Column("bbr_mrtt_us", BigInteger, nullable=True),
    Column("bbr_pacing_gain", Float, nullable=True),
    Column("bbr_cwnd_gain", Float, nullable=True),
    # TCP_INFO busy / rwnd_limited / sndbuf_limited time so far (G-SOCKBUF post); ss prints them only when > 0
    *(Column(c, BigInteger, nullable=False, server_default="0")
      for c in ("busy_ms", "rwnd_limited_ms", "sndbuf_limited_ms")),
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

# Kernel-side timing (docs/plans.md#kernel_trace, orchestrator/ingest/ktrace.py): one row per event; kprobe pairs
# carry duration_ns, trace_printk lines of the `<name> ... <n> ns` form value (ns); runs tagged timing (G-PROBE).
kernel_trace = Table(
    "kernel_trace", metadata,
    Column("run_id", String(128), nullable=False),
    Column("host", String(64), nullable=False),
    Column("ts_ns", BigInteger, nullable=False),           # CLOCK_REALTIME (converted from trace clock mono)
    Column("cpu", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("source", String(10), nullable=False),          # kprobe | tracepoint | printk
    Column("event", String(64), nullable=False),
    Column("duration_ns", BigInteger, nullable=True),
    Column("value", Float, nullable=True),
    Column("text", String(160), nullable=False),
)

# One row per application write of an app-limited flow (records.APP_WRITE; M-APPLAT, M-APPREAD)
app_write = Table(
    "app_write", metadata,
    Column("run_id", String(128), nullable=False),
    Column("flow_id", Integer, nullable=False),
    Column("write_index", Integer, nullable=False),
    Column("sched_ns", BigInteger, nullable=False),
    Column("t_ns", BigInteger, nullable=False),
    Column("stream_offset", BigInteger, nullable=False),   # not `offset`: an SQL keyword
    Column("len", Integer, nullable=False),
    Column("accepted", Integer, nullable=False),
    Column("arrive_ns", BigInteger, nullable=True),
    Column("arrivals", Integer, nullable=False),
    Column("read_ns", BigInteger, nullable=True),
    Column("latency_ns", BigInteger, nullable=True),
    Column("read_latency_ns", BigInteger, nullable=True),
)
Index("ix_app_write_run_id", app_write.c.run_id, app_write.c.flow_id)
Index("ix_run_started_at", run.c.started_at)   # the run list, newest first, a page at a time

# Per-packet tables: BRIN on (run_key, time) on PostgreSQL: built after the load of each partition in
# one cheap pass, and packets arrive in time order per capture point; a plain B-tree on SQLite, where it
# also serves per-run deletes.
Index("ix_packet_run_ts", packet.c.run_key, packet.c.ts_ns, postgresql_using="brin")
Index("ix_packet_block_run_ts", packet_block.c.run_key, packet_block.c.ts_first_ns, postgresql_using="brin")
Index("ix_qdelay_run_ts", qdelay.c.run_key, qdelay.c.ts_in_ns, postgresql_using="brin")
Index("ix_tcp_probe_run_ts", tcp_probe.c.run_key, tcp_probe.c.ts_ns, postgresql_using="brin")
Index("ix_qdisc_sample_run_ts", qdisc_sample.c.run_key, qdisc_sample.c.ts_ns, postgresql_using="brin")
Index("ix_ss_sample_run_ts", ss_sample.c.run_key, ss_sample.c.ts_ns, postgresql_using="brin")
Index("ix_iperf_interval_run_id", iperf_interval.c.run_id)
Index("ix_kernel_trace_run_id", kernel_trace.c.run_id, kernel_trace.c.event)

PARTITION_SCHEMA = "tcplab_part"
PARTITIONED_TABLES = (packet_block, qdelay, tcp_probe, qdisc_sample, ss_sample)   # PostgreSQL, keyed by run_key
# Tables that exist on one backend only: on PostgreSQL `packet` is a view over packet_block
BACKEND_ONLY = {"packet_block": "postgresql", "packet": "sqlite"}


def in_schema(table_name: str, dialect: str) -> bool:
    """Whether `table_name` is a table of the migrated schema on this backend (Alembic compares only these)."""
    return BACKEND_ONLY.get(table_name, dialect) == dialect


def run_key_tables(dialect: str) -> tuple[Table, ...]:
    """The per-packet tables keyed by run_key on this backend (partitioned on PostgreSQL)."""
    if dialect == "postgresql":
        return PARTITIONED_TABLES
    return (packet, *PARTITIONED_TABLES[1:])

# the campaign tables share this MetaData (imported last: they import `metadata` from here)
from orchestrator.storage import campaign_tables as _campaign_tables  # noqa: E402,F401
