"""the shared result database: run provenance columns and the views for the common questions (docs/database.md).

run.run_by, run.testbed, run.tcplab_version, run.tcplab_commit, run.plan_commit (NULL for runs stored before);
views v_run, v_flow, v_run_qdelay, v_run_rtt, v_campaign_verdict, v_campaign_trend (orchestrator/storage/views.py).
Roles are not made here: they are per cluster and need a superuser (`tcplab db init`, orchestrator/storage/roles.py).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from orchestrator.storage import views

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("run_by", 64), ("testbed", 128), ("tcplab_version", 64), ("tcplab_commit", 64), ("plan_commit", 64))


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        for name, size in COLUMNS:
            batch.add_column(sa.Column(name, sa.String(size), nullable=True))
    views.create_views(op.get_bind())


def downgrade() -> None:
    views.drop_views(op.get_bind())
    with op.batch_alter_table("run") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
