"""ss_sample: the TCP_INFO chrono times busy / rwnd_limited / sndbuf_limited (ms so far), for G-SOCKBUF post.

ss prints them only when non-zero, so existing rows take 0. On PostgreSQL adding a column to the
partitioned parent adds it to every partition.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("busy_ms", "rwnd_limited_ms", "sndbuf_limited_ms")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("ss_sample", sa.Column(name, sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    for name in COLUMNS:
        op.drop_column("ss_sample", name)
