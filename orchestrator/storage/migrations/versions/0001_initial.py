"""Initial result schema: plan, run, flow, artifact, host_evidence and the per-run bulk tables.

Written out in full rather than imported from tables.py, so this revision stays what it was when
tables.py changes; tests/db/test_schema.py checks that head still equals tables.metadata.

Revision ID: 0001
Revises:
Create Date: 2024-11-21
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _run_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["run_id"], ["run.run_id"], ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "plan",
        sa.Column("plan_sha256", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("plan_sha256"),
    )
    op.create_table(
        "run",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("plan_sha256", sa.String(64), nullable=True),
        sa.Column("plan_name", sa.String(200), nullable=False),
        sa.Column("experiment", sa.String(200), nullable=False),
        sa.Column("repetition", sa.Integer, nullable=False),
        sa.Column("seed", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("derived", sa.JSON, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("t0_ns", sa.BigInteger, nullable=True),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("flags", sa.JSON, nullable=False),
        sa.ForeignKeyConstraint(["plan_sha256"], ["plan.plan_sha256"]),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_table(
        "flow",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("flow_id", sa.Integer, nullable=False),
        sa.Column("src_host", sa.String(64), nullable=False),
        sa.Column("dst_host", sa.String(64), nullable=False),
        sa.Column("src_addr", sa.String(45), nullable=False),
        sa.Column("dst_addr", sa.String(45), nullable=False),
        sa.Column("src_port", sa.Integer, nullable=True),
        sa.Column("dst_port", sa.Integer, nullable=False),
        sa.Column("cc", sa.String(32), nullable=False),
        sa.Column("start_s", sa.Float, nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("tool", sa.String(32), nullable=False),
        _run_fk(),
        sa.PrimaryKeyConstraint("run_id", "flow_id"),
    )
    op.create_table(
        "artifact",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("meta", sa.JSON, nullable=False),
        _run_fk(),
        sa.PrimaryKeyConstraint("run_id", "host", "name"),
    )
    op.create_table(
        "host_evidence",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
        _run_fk(),
        sa.PrimaryKeyConstraint("run_id", "host", "phase"),
    )
    op.create_table(
        "packet",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("point", sa.String(100), nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("src_addr", sa.String(45), nullable=False),
        sa.Column("dst_addr", sa.String(45), nullable=False),
        sa.Column("src_port", sa.Integer, nullable=False),
        sa.Column("dst_port", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ack", sa.BigInteger, nullable=False),
        sa.Column("payload_len", sa.Integer, nullable=False),
        sa.Column("ip_len", sa.Integer, nullable=False),
        sa.Column("tcp_flags", sa.SmallInteger, nullable=False),
        sa.Column("ecn", sa.SmallInteger, nullable=False),
        sa.Column("ip_id", sa.Integer, nullable=False),
        sa.Column("tsval", sa.BigInteger, nullable=False),
        sa.Column("tsecr", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_packet_run_point_ts", "packet", ["run_id", "point", "ts_ns"])
    op.create_table(
        "tcp_probe",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("saddr", sa.String(45), nullable=False),
        sa.Column("sport", sa.Integer, nullable=False),
        sa.Column("daddr", sa.String(45), nullable=False),
        sa.Column("dport", sa.Integer, nullable=False),
        sa.Column("snd_cwnd", sa.BigInteger, nullable=False),
        sa.Column("ssthresh", sa.BigInteger, nullable=False),
        sa.Column("srtt_us", sa.BigInteger, nullable=False),
        sa.Column("snd_wnd", sa.BigInteger, nullable=False),
        sa.Column("rcv_wnd", sa.BigInteger, nullable=False),
        sa.Column("snd_nxt", sa.BigInteger, nullable=False),
        sa.Column("snd_una", sa.BigInteger, nullable=False),
        sa.Column("data_len", sa.Integer, nullable=False),
        sa.Column("sock_cookie", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_tcp_probe_run_id", "tcp_probe", ["run_id"])
    op.create_table(
        "qdisc_sample",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("interface", sa.String(64), nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("handle", sa.String(16), nullable=False),
        sa.Column("parent", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("packets", sa.BigInteger, nullable=False),
        sa.Column("drops", sa.BigInteger, nullable=False),
        sa.Column("overlimits", sa.BigInteger, nullable=False),
        sa.Column("requeues", sa.BigInteger, nullable=False),
        sa.Column("backlog_bytes", sa.BigInteger, nullable=False),
        sa.Column("qlen", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_qdisc_sample_run_id", "qdisc_sample", ["run_id"])
    op.create_table(
        "iperf_interval",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("flow_id", sa.Integer, nullable=False),
        sa.Column("stream_port", sa.Integer, nullable=False),
        sa.Column("start_s", sa.Float, nullable=False),
        sa.Column("end_s", sa.Float, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("bits_per_second", sa.Float, nullable=False),
        sa.Column("retransmits", sa.BigInteger, nullable=False),
        sa.Column("snd_cwnd", sa.BigInteger, nullable=False),
        sa.Column("rtt_us", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_iperf_interval_run_id", "iperf_interval", ["run_id"])


def downgrade() -> None:
    for index, table in (("ix_iperf_interval_run_id", "iperf_interval"),
                         ("ix_qdisc_sample_run_id", "qdisc_sample"),
                         ("ix_tcp_probe_run_id", "tcp_probe"),
                         ("ix_packet_run_point_ts", "packet")):
        op.drop_index(index, table_name=table)
        op.drop_table(table)
    for table in ("host_evidence", "artifact", "flow", "run", "plan"):
        op.drop_table(table)
