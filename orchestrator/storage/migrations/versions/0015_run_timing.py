"""run.timing: the run's phase timings and orchestration overhead (orchestrator/engine/timing.py); flow
scheduled_start_ns, measured_start_ns, start_skew_ns (M-STARTSKEW) and start_point: when each flow was
scheduled to start, when its first SYN was captured (in the manager's clock) and at which capture point.

Existing rows stay NULL: no run was timed before this revision.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FLOW_COLUMNS = (("scheduled_start_ns", sa.BigInteger), ("measured_start_ns", sa.BigInteger),
                ("start_skew_ns", sa.BigInteger), ("start_point", sa.String(128)))


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("timing", sa.JSON, nullable=True))
    with op.batch_alter_table("flow") as batch:
        for name, kind in FLOW_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("flow") as batch:
        for name, _ in reversed(FLOW_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("run") as batch:
        batch.drop_column("timing")
