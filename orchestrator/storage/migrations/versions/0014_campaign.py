"""campaigns: campaign, campaign_run (a night), trial, trial_metric, campaign_verdict, campaign_lease
(docs/campaigns.md).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "campaign",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
    )
    op.create_table(
        "campaign_run",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("campaign", sa.String(64), sa.ForeignKey("campaign.name", ondelete="CASCADE"), nullable=False),
        sa.Column("night", sa.Integer, nullable=False),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("campaign_sha256", sa.String(64), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("summary", sa.JSON, nullable=True),
        sa.UniqueConstraint("campaign", "night", name="uq_campaign_run_night"),
    )
    op.create_table(
        "trial",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("campaign_run_id", sa.Integer, sa.ForeignKey("campaign_run.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("cell_key", sa.String(64), nullable=False),
        sa.Column("cell_label", sa.Text, nullable=False),
        sa.Column("plan_sha256", sa.String(64), nullable=False),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("repetition", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False, unique=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("releases", sa.JSON, nullable=True),
        sa.Column("boot_ids", sa.JSON, nullable=True),
        sa.Column("artifacts", sa.JSON, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("manager", sa.String(200), nullable=True),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("finished_at", TZ, nullable=True),
        sa.UniqueConstraint("campaign_run_id", "cell_key", "variant", "repetition", "attempt", name="uq_trial_slot"),
    )
    op.create_index("ix_trial_night_status", "trial", ["campaign_run_id", "status"])
    op.create_table(
        "trial_metric",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trial.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("metric", sa.String(40), primary_key=True),
        sa.Column("value", sa.Float, nullable=True),
    )
    op.create_table(
        "campaign_verdict",
        sa.Column("campaign_run_id", sa.Integer, sa.ForeignKey("campaign_run.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("check_index", sa.Integer, primary_key=True),
        sa.Column("cell_key", sa.String(64), primary_key=True),
        sa.Column("variant", sa.String(64), primary_key=True),
        sa.Column("metric", sa.String(40), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(20), nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_table(
        "campaign_lease",
        sa.Column("campaign", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("acquired_at", TZ, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
    )


def downgrade() -> None:
    for name in ("campaign_lease", "campaign_verdict", "trial_metric"):
        op.drop_table(name)
    op.drop_index("ix_trial_night_status", table_name="trial")
    for name in ("trial", "campaign_run", "campaign"):
        op.drop_table(name)
