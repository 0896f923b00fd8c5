"""flow sink_bytes, sink_goodput_bps and fct_ns: a `bulk` flow's bytes read by its sink, their goodput from the
flow's scheduled start and a byte-limited flow's completion time (orchestrator/ingest/bulkflows.py).

Existing rows stay NULL: no run had bulk flows before this revision.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from orchestrator.storage import views

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FLOW_COLUMNS = (("sink_bytes", sa.BigInteger), ("sink_goodput_bps", sa.Float), ("fct_ns", sa.BigInteger))


def upgrade() -> None:
    for name, kind in FLOW_COLUMNS:   # nullable columns: a plain ADD COLUMN on both backends
        op.add_column("flow", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # SQLite drops a column by copying the table, which a view over it (v_flow) refuses: the views go first and
    # come back unchanged (no view reads these columns)
    views.drop_views(op.get_bind())
    with op.batch_alter_table("flow") as batch:
        for name, _ in reversed(FLOW_COLUMNS):
            batch.drop_column(name)
    views.create_views(op.get_bind())

