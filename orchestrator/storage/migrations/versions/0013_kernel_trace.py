"""kernel_trace: kernel-side timing events per run and host (plan field kernel_trace, orchestrator/ingest/ktrace.py):
tracepoint hits, trace_printk lines (text, and the ns number of a `<name> ... <n> ns` line), kprobe/kretprobe pairs
with their duration. Keyed by run_id like iperf_interval (deleted with the run). Nothing to carry over.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "kernel_trace",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("cpu", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("source", sa.String(10), nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("duration_ns", sa.BigInteger, nullable=True),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("text", sa.String(160), nullable=False),
    )
    op.create_index("ix_kernel_trace_run_id", "kernel_trace", ["run_id", "event"])


def downgrade() -> None:
    op.drop_index("ix_kernel_trace_run_id", table_name="kernel_trace")
    op.drop_table("kernel_trace")
