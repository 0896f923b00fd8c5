"""ss_sample: per-socket `ss -tinH` samples on the senders (orchestrator/ingest/ss.py).

One row per socket per poll, keyed by run_key like tcp_probe: on PostgreSQL LIST-partitioned by
run_key (partitions in schema tcplab_part, made by the writer), BRIN on (run_key, ts_ns); a plain
table with a B-tree on SQLite. dctcp_alpha is a fraction 0..1 (the kernel's alpha / 1024). Nothing to
carry over: no earlier revision had these rows.

Revision ID: 0003
Revises: 0002
Create Date: 2024-12-02
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTERS = ("cwnd", "mss", "bytes_sent", "bytes_retrans", "bytes_acked", "unacked", "lost", "delivered",
             "delivered_ce")


def upgrade() -> None:
    big, flt = sa.BigInteger, sa.Float
    op.create_table(
        "ss_sample",
        sa.Column("run_key", sa.Integer, nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("ts_ns", big, nullable=False),
        sa.Column("saddr", sa.String(45), nullable=False),
        sa.Column("sport", sa.Integer, nullable=False),
        sa.Column("daddr", sa.String(45), nullable=False),
        sa.Column("dport", sa.Integer, nullable=False),
        sa.Column("cc", sa.String(16), nullable=False),
        *(sa.Column(c, big, nullable=False) for c in _COUNTERS),
        *(sa.Column(c, big, nullable=True) for c in ("ssthresh", "rtt_us", "rttvar_us", "minrtt_us",
                                                     "delivery_rate_bit", "pacing_rate_bit")),
        sa.Column("retrans", big, nullable=False),
        sa.Column("retrans_total", big, nullable=False),
        sa.Column("dctcp_alpha", flt, nullable=True),
        sa.Column("dctcp_ab_ecn", big, nullable=True),
        sa.Column("dctcp_ab_tot", big, nullable=True),
        sa.Column("bbr_bw_bit", big, nullable=True),
        sa.Column("bbr_mrtt_us", big, nullable=True),
        sa.Column("bbr_pacing_gain", flt, nullable=True),
        sa.Column("bbr_cwnd_gain", flt, nullable=True),
        postgresql_partition_by="LIST (run_key)",
    )
    op.create_index("ix_ss_sample_run_ts", "ss_sample", ["run_key", "ts_ns"], postgresql_using="brin")


def downgrade() -> None:
    op.drop_index("ix_ss_sample_run_ts", table_name="ss_sample")
    op.drop_table("ss_sample")   # drops the partitions with it
