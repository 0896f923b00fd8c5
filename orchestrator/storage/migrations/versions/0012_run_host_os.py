"""run_host.os_*: the operating system each host's agent reported at hello (platform.uname's system, and the
ID and VERSION_ID of /etc/os-release), next to its kernel (docs/host-state.md, G-HETERO).

Revision ID: 0012
Revises: 0009
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("os_system", 32), ("os_id", 64), ("os_version_id", 64))


def upgrade() -> None:
    with op.batch_alter_table("run_host") as batch:
        for name, size in COLUMNS:
            batch.add_column(sa.Column(name, sa.String(size), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_host") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
