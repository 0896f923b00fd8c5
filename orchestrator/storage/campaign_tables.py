"""The campaign tables (docs/campaigns.md): a campaign's file, its nightly runs, their trials with status and
provenance, each trial's metric values, the verdicts, and the lease that keeps two managers off one campaign.

Kept apart from tables.py (the run tables) but on the same MetaData, so migrations and the schema test see one
schema. A trial refers to its run by `run_id` without a foreign key: the trial exists (pending) before its run.
"""
from __future__ import annotations

from sqlalchemy import JSON, Column, DateTime, Float, ForeignKey, Index, Integer, String, Table, Text, UniqueConstraint

from orchestrator.storage.tables import metadata

TRIAL_STATUSES = ("pending", "running", "ok", "failed", "refused", "infra-error")
RUN_TO_TRIAL = {"complete": "ok", "failed": "failed", "refused": "refused"}   # the run's stored status -> trial's

campaign = Table(
    "campaign", metadata,
    Column("name", String(64), primary_key=True),
    Column("sha256", String(64), nullable=False),          # of the campaign file as last run
    Column("path", Text, nullable=False),
    Column("text", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

campaign_run = Table(
    # one night of a campaign: `tcplab campaign run` starts one, `resume` finishes it
    "campaign_run", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("campaign", String(64), ForeignKey("campaign.name", ondelete="CASCADE"), nullable=False),
    Column("night", Integer, nullable=False),              # 1, 2, ... per campaign
    Column("label", String(64), nullable=False),           # e.g. the date, or --label
    Column("campaign_sha256", String(64), nullable=False),
    Column("status", String(20), nullable=False),          # running | done
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("summary", JSON, nullable=True),                # verdict counts, overhead per run
    UniqueConstraint("campaign", "night", name="uq_campaign_run_night"),
)

trial = Table(
    # one (cell, variant, repetition, attempt); ok only in the transaction that stores its run with the artifacts'
    # sha256 (orchestrator/storage/trials.py)
    "trial", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("campaign_run_id", Integer, ForeignKey("campaign_run.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),                # execution order within the night (ABBA)
    Column("cell_key", String(64), nullable=False),
    Column("cell_label", Text, nullable=False),
    Column("plan_sha256", String(64), nullable=False),
    Column("variant", String(64), nullable=False),
    Column("repetition", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("status", String(20), nullable=False),          # TRIAL_STATUSES
    Column("run_id", String(128), nullable=False, unique=True),
    Column("spec", JSON, nullable=False),                  # the trial's RunSpec
    Column("releases", JSON, nullable=True),               # host -> uname -r the agent reported
    Column("boot_ids", JSON, nullable=True),               # host -> boot_id
    Column("artifacts", JSON, nullable=True),              # [{host, name, sha256}] committed with the run
    Column("error", Text, nullable=True),
    Column("manager", String(200), nullable=True),         # host:pid of the manager that ran it
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("campaign_run_id", "cell_key", "variant", "repetition", "attempt", name="uq_trial_slot"),
)
Index("ix_trial_night_status", trial.c.campaign_run_id, trial.c.status)

trial_metric = Table(
    # one steady-state value per trial and metric (analysis/compare.py METRICS, in the metric's display unit)
    "trial_metric", metadata,
    Column("trial_id", Integer, ForeignKey("trial.id", ondelete="CASCADE"), primary_key=True),
    Column("metric", String(40), primary_key=True),
    Column("value", Float, nullable=True),
)

campaign_verdict = Table(
    "campaign_verdict", metadata,
    Column("campaign_run_id", Integer, ForeignKey("campaign_run.id", ondelete="CASCADE"), primary_key=True),
    Column("check_index", Integer, primary_key=True),
    Column("cell_key", String(64), primary_key=True),
    Column("variant", String(64), primary_key=True),
    Column("metric", String(40), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("verdict", String(20), nullable=False),         # PASS | REGRESSION | INCONCLUSIVE | NO DATA
    Column("detail", JSON, nullable=False),                # estimate, CI, p, p adjusted, samples, trend
)

campaign_lease = Table(
    # at most one manager per campaign: taken when free or expired (or its holder's process on this machine is
    # gone), renewed while the campaign runs, released at the end
    "campaign_lease", metadata,
    Column("campaign", String(64), primary_key=True),
    Column("holder", String(200), nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)
