"""flow.ack_ratio: M-ACKRATIO, the data segments per pure ACK a flow's receiver sent in the flow's steady part
(orchestrator/guards/ack.py, G-ACK); NULL for runs without an ack_policy or without a capture point that saw
both directions.

Existing rows stay NULL: no run was measured before this revision.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("flow") as batch:
        batch.add_column(sa.Column("ack_ratio", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("flow") as batch:
        batch.drop_column("ack_ratio")
