"""run_host: per run and host, the kernel it ran on -- the plan's variant and expected build key, and the
release, boot_id and installed build the host's agent reported at hello (docs/kernels.md, G-VARIANT).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_host",
        sa.Column("run_id", sa.String(128), sa.ForeignKey("run.run_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("host", sa.String(64), primary_key=True),
        sa.Column("variant", sa.String(64), nullable=True),
        sa.Column("vanilla", sa.Boolean, nullable=True),
        sa.Column("build_key", sa.String(64), nullable=True),
        sa.Column("release", sa.String(128), nullable=True),
        sa.Column("boot_id", sa.String(36), nullable=True),
        sa.Column("installed_build_key", sa.String(64), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("run_host")
