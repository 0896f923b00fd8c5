"""app_write: one row per application write of an app-limited (thin-stream) flow, with its arrival at the
receiver side, the sink's read and the application-layer latencies (M-APPLAT, M-APPREAD; docs/ingest.md).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "app_write",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("flow_id", sa.Integer, nullable=False),
        sa.Column("write_index", sa.Integer, nullable=False),
        sa.Column("sched_ns", sa.BigInteger, nullable=False),
        sa.Column("t_ns", sa.BigInteger, nullable=False),
        sa.Column("stream_offset", sa.BigInteger, nullable=False),
        sa.Column("len", sa.Integer, nullable=False),
        sa.Column("accepted", sa.Integer, nullable=False),
        sa.Column("arrive_ns", sa.BigInteger, nullable=True),
        sa.Column("arrivals", sa.Integer, nullable=False),
        sa.Column("read_ns", sa.BigInteger, nullable=True),
        sa.Column("latency_ns", sa.BigInteger, nullable=True),
        sa.Column("read_latency_ns", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_app_write_run_id", "app_write", ["run_id", "flow_id"])


def downgrade() -> None:
    op.drop_index("ix_app_write_run_id", table_name="app_write")
    op.drop_table("app_write")
