"""kernel_build: one row per kernel build tcplab made (orchestrator/kernel/; docs/kernels.md), keyed by the
build key (sha256 of the pinned inputs and toolchain), with the release it boots as and its metadata.json.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "kernel_build",
        sa.Column("build_key", sa.String(64), primary_key=True),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("release", sa.String(128), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("kernel_build")
