"""Plans: YAML experiment plans, their validation, and their expansion into RunSpecs.

Public API: `load_plan(path) -> Plan` (raises `PlanError` listing every problem as FILE:LINE:COL),
`expand(plan) -> list[RunSpec]`, `plan_sha256(path)`; CLI helpers live in `orchestrator.plan.commands`.
See docs/plans.md for the format.
"""
from orchestrator.plan.errors import Issue, PlanError
from orchestrator.plan.expand import expand
from orchestrator.plan.loader import load_plan, load_plan_text, plan_sha256
from orchestrator.plan.model import Plan

__all__ = ["Issue", "Plan", "PlanError", "expand", "load_plan", "load_plan_text", "plan_sha256"]
