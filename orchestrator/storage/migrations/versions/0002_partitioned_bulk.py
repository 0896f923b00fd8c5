"""Line-rate ingest layout: run_key, conn, capture_point, qdelay, partitioned per-packet tables.

- run.run_key: a small integer per run (PostgreSQL: from sequence run_key_seq), the key of the
  per-packet tables instead of the text run_id.
- packet: point/addresses/ports move to `conn` (one row per direction of a 5-tuple at a capture
  point); packet rows keep conn_id and the per-packet values.
- qdelay (per-packet queue delay from paired captures), qdelay_pair (its per-run summary),
  capture_point (reader and tcpdump counts per capture).
- PostgreSQL: packet, qdelay, tcp_probe, qdisc_sample are LIST-partitioned by run_key, partitions
  in schema tcplab_part (one per run, made by the writer), BRIN indexes on (run_key, time).
Existing rows are carried over (packet -> conn + packet). Downgrade restores the 0001 tables empty.

Revision ID: 0002
Revises: 0001
Create Date: 2024-11-22
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "tcplab_part"
BULK = ("packet", "qdelay", "tcp_probe", "qdisc_sample")
_OLD = ("packet", "tcp_probe", "qdisc_sample")


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _bulk_table(name: str, *cols: sa.Column) -> None:
    kw = {"postgresql_partition_by": "LIST (run_key)"}
    op.create_table(name, sa.Column("run_key", sa.Integer, nullable=False), *cols, **kw)


def _create_new_tables() -> None:
    op.create_table(
        "capture_point",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("point_id", sa.SmallInteger, nullable=False),
        sa.Column("point", sa.String(100), nullable=False),
        sa.Column("host", sa.String(64), nullable=True),
        sa.Column("interface", sa.String(64), nullable=True),
        *(sa.Column(c, sa.BigInteger, nullable=False)
          for c in ("records", "tcp", "udp", "other", "truncated", "trailing_bytes")),
        *(sa.Column(c, sa.BigInteger, nullable=True) for c in ("captured", "received_by_filter", "dropped_by_kernel")),
        sa.ForeignKeyConstraint(["run_id"], ["run.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "point_id"),
    )
    op.create_table(
        "conn",
        sa.Column("run_key", sa.Integer, nullable=False),
        sa.Column("conn_id", sa.Integer, nullable=False),
        sa.Column("point", sa.String(100), nullable=False),
        sa.Column("proto", sa.SmallInteger, nullable=False),
        sa.Column("ipv", sa.SmallInteger, nullable=False),
        sa.Column("src_addr", sa.String(45), nullable=False),
        sa.Column("dst_addr", sa.String(45), nullable=False),
        sa.Column("src_port", sa.Integer, nullable=False),
        sa.Column("dst_port", sa.Integer, nullable=False),
        sa.ForeignKeyConstraint(["run_key"], ["run.run_key"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_key", "conn_id"),
    )
    op.create_table(
        "qdelay_pair",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("ingress", sa.String(100), nullable=False),
        sa.Column("egress", sa.String(100), nullable=False),
        sa.Column("d_fwd_ns", sa.BigInteger, nullable=False),
        sa.Column("d_fwd_source", sa.String(32), nullable=False),
        sa.Column("netem_ns", sa.BigInteger, nullable=False),
        *(sa.Column(c, sa.BigInteger, nullable=False) for c in ("matched", "dropped", "ce", "unmatched_egress")),
        sa.ForeignKeyConstraint(["run_id"], ["run.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "ingress", "egress"),
    )
    big, i4, i2 = sa.BigInteger, sa.Integer, sa.SmallInteger

    def cols(*spec: tuple[str, type, bool]) -> list[sa.Column]:
        return [sa.Column(n, t, nullable=nullable) for n, t, nullable in spec]

    _bulk_table("packet", *cols(("conn_id", i4, False), ("ts_ns", big, False), ("seq", big, False),
                                ("ack", big, False), ("payload_len", i4, False), ("ip_len", i4, False),
                                ("tcp_flags", i2, False), ("ecn", i2, False), ("ip_id", i4, False),
                                ("tsval", big, False), ("tsecr", big, False)))
    _bulk_table("qdelay", *cols(("conn_id", i4, False), ("ts_in_ns", big, False), ("ts_out_ns", big, True),
                                ("sojourn_ns", big, True), ("payload_len", i4, False), ("ce", i2, False),
                                ("dropped", i2, False)))
    _bulk_table("tcp_probe", *cols(("host", sa.String(64), False), ("ts_ns", big, False),
                                   ("saddr", sa.String(45), False), ("sport", i4, False),
                                   ("daddr", sa.String(45), False), ("dport", i4, False),
                                   *((c, big, False) for c in ("snd_cwnd", "ssthresh", "srtt_us", "snd_wnd",
                                                               "rcv_wnd", "snd_nxt", "snd_una")),
                                   ("data_len", i4, False), ("sock_cookie", big, False)))
    _bulk_table("qdisc_sample", *cols(("host", sa.String(64), False), ("interface", sa.String(64), False),
                                      ("ts_ns", big, False), ("handle", sa.String(16), False),
                                      ("parent", sa.String(16), False), ("kind", sa.String(16), False),
                                      *((c, big, False) for c in ("bytes", "packets", "drops", "overlimits",
                                                                  "requeues", "backlog_bytes", "qlen"))))
    for table, ts in (("packet", "ts_ns"), ("qdelay", "ts_in_ns"), ("tcp_probe", "ts_ns"),
                      ("qdisc_sample", "ts_ns")):
        op.create_index(f"ix_{table}_run_ts", table, ["run_key", ts], postgresql_using="brin")


_PACKET_VALUES = "ts_ns, seq, ack, payload_len, ip_len, tcp_flags, ecn, ip_id, tsval, tsecr"
_PROBE = ("host, ts_ns, saddr, sport, daddr, dport, snd_cwnd, ssthresh, srtt_us, snd_wnd, rcv_wnd, snd_nxt, "
          "snd_una, data_len, sock_cookie")
_QDISC = ("host, interface, ts_ns, handle, parent, kind, bytes, packets, drops, overlimits, requeues, "
          "backlog_bytes, qlen")


def _carry_over() -> None:
    """Move the 0001 rows (in *_old tables) into the new layout."""
    if _pg():
        keys = [k for (k,) in op.get_bind().execute(sa.text("SELECT run_key FROM run"))]
        for table in BULK:
            for k in keys:
                op.execute(f"CREATE TABLE {SCHEMA}.{table}_{k} PARTITION OF {table} FOR VALUES IN ({k})")
    op.execute(
        "INSERT INTO conn (run_key, conn_id, point, proto, ipv, src_addr, dst_addr, src_port, dst_port) "
        "SELECT r.run_key, dense_rank() OVER (PARTITION BY o.run_id ORDER BY o.point, o.src_addr, o.dst_addr, "
        "o.src_port, o.dst_port) - 1, o.point, 6, CASE WHEN o.src_addr LIKE '%:%' THEN 6 ELSE 4 END, "
        "o.src_addr, o.dst_addr, o.src_port, o.dst_port "
        "FROM (SELECT DISTINCT run_id, point, src_addr, dst_addr, src_port, dst_port FROM packet_old) o "
        "JOIN run r ON r.run_id = o.run_id")
    op.execute(
        f"INSERT INTO packet (run_key, conn_id, {_PACKET_VALUES}) "
        f"SELECT r.run_key, c.conn_id, {', '.join('p.' + c for c in _PACKET_VALUES.split(', '))} "
        "FROM packet_old p JOIN run r ON r.run_id = p.run_id JOIN conn c ON c.run_key = r.run_key "
        "AND c.point = p.point AND c.src_addr = p.src_addr AND c.dst_addr = p.dst_addr "
        "AND c.src_port = p.src_port AND c.dst_port = p.dst_port")
    for table, columns in (("tcp_probe", _PROBE), ("qdisc_sample", _QDISC)):
        op.execute(f"INSERT INTO {table} (run_key, {columns}) SELECT r.run_key, "
                   f"{', '.join('o.' + c for c in columns.split(', '))} FROM {table}_old o "
                   "JOIN run r ON r.run_id = o.run_id")


def upgrade() -> None:
    with op.batch_alter_table("run") as b:
        b.add_column(sa.Column("run_key", sa.Integer, nullable=True))
    op.execute("UPDATE run SET run_key = (SELECT count(*) FROM run r2 WHERE r2.run_id <= run.run_id)")
    with op.batch_alter_table("run") as b:
        b.alter_column("run_key", existing_type=sa.Integer, nullable=False)
        b.create_unique_constraint("uq_run_run_key", ["run_key"])
    if _pg():
        op.execute("CREATE SEQUENCE run_key_seq")
        op.execute("SELECT setval('run_key_seq', (SELECT coalesce(max(run_key), 0) + 1 FROM run), false)")
        op.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    for table in _OLD:
        op.rename_table(table, f"{table}_old")
    _create_new_tables()
    _carry_over()
    for index, table in (("ix_packet_run_point_ts", "packet_old"), ("ix_tcp_probe_run_id", "tcp_probe_old"),
                         ("ix_qdisc_sample_run_id", "qdisc_sample_old")):
        op.drop_index(index, table_name=table)
        op.drop_table(table)


def downgrade() -> None:
    for table in BULK:
        op.drop_index(f"ix_{table}_run_ts", table_name=table)
        op.drop_table(table)   # drops the partitions with it
    for table in ("qdelay_pair", "conn", "capture_point"):
        op.drop_table(table)
    if _pg():
        op.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        op.execute("DROP SEQUENCE IF EXISTS run_key_seq")
    with op.batch_alter_table("run") as b:
        b.drop_constraint("uq_run_run_key", type_="unique")
        b.drop_column("run_key")
    big, i4, i2, s = sa.BigInteger, sa.Integer, sa.SmallInteger, sa.String
    rid = sa.Column("run_id", s(128), nullable=False)
    op.create_table("packet", rid, sa.Column("point", s(100), nullable=False),
                    sa.Column("ts_ns", big, nullable=False), sa.Column("src_addr", s(45), nullable=False),
                    sa.Column("dst_addr", s(45), nullable=False), sa.Column("src_port", i4, nullable=False),
                    sa.Column("dst_port", i4, nullable=False), sa.Column("seq", big, nullable=False),
                    sa.Column("ack", big, nullable=False), sa.Column("payload_len", i4, nullable=False),
                    sa.Column("ip_len", i4, nullable=False), sa.Column("tcp_flags", i2, nullable=False),
                    sa.Column("ecn", i2, nullable=False), sa.Column("ip_id", i4, nullable=False),
                    sa.Column("tsval", big, nullable=False), sa.Column("tsecr", big, nullable=False))
    op.create_index("ix_packet_run_point_ts", "packet", ["run_id", "point", "ts_ns"])
    op.create_table("tcp_probe", sa.Column("run_id", s(128), nullable=False),
                    sa.Column("host", s(64), nullable=False), sa.Column("ts_ns", big, nullable=False),
                    sa.Column("saddr", s(45), nullable=False), sa.Column("sport", i4, nullable=False),
                    sa.Column("daddr", s(45), nullable=False), sa.Column("dport", i4, nullable=False),
                    *(sa.Column(c, big, nullable=False) for c in ("snd_cwnd", "ssthresh", "srtt_us", "snd_wnd",
                                                                  "rcv_wnd", "snd_nxt", "snd_una")),
                    sa.Column("data_len", i4, nullable=False), sa.Column("sock_cookie", big, nullable=False))
    op.create_index("ix_tcp_probe_run_id", "tcp_probe", ["run_id"])
    op.create_table("qdisc_sample", sa.Column("run_id", s(128), nullable=False),
                    sa.Column("host", s(64), nullable=False), sa.Column("interface", s(64), nullable=False),
                    sa.Column("ts_ns", big, nullable=False), sa.Column("handle", s(16), nullable=False),
                    sa.Column("parent", s(16), nullable=False), sa.Column("kind", s(16), nullable=False),
                    *(sa.Column(c, big, nullable=False) for c in ("bytes", "packets", "drops", "overlimits",
                                                                  "requeues", "backlog_bytes", "qlen")))
    op.create_index("ix_qdisc_sample_run_id", "qdisc_sample", ["run_id"])
