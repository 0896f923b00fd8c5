"""run.profile: the testbed profile a run was adapted with (docs/profiles.md); NULL for a run of the plan as
written. The substitutions themselves are in the run's spec (`spec.substitutions`); the name is a column so
results of one plan on two testbeds can be told apart in SQL.

Existing rows stay NULL: no run had a profile before this revision.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("profile", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("profile")
