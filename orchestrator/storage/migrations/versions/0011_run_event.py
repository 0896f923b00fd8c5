"""run_event: the timed plan events of a run as the agents performed them -- scheduled, issued and effective
times, the lag, and the read-back after the change (docs/plans.md "Events", docs/ingest.md).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_event",
        sa.Column("run_id", sa.String(128), sa.ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("event_index", sa.Integer, primary_key=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("interface", sa.String(64), nullable=True),
        sa.Column("scheduled_ns", sa.BigInteger, nullable=False),
        sa.Column("issued_ns", sa.BigInteger, nullable=True),
        sa.Column("effective_ns", sa.BigInteger, nullable=True),
        sa.Column("lag_ns", sa.BigInteger, nullable=True),
        sa.Column("end_scheduled_ns", sa.BigInteger, nullable=True),
        sa.Column("end_effective_ns", sa.BigInteger, nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_event")
