"""Plans: YAML experiment plans, checked once when loaded, then expanded into RunSpecs.

Three subpackages, each depending only on the ones before it:
  - `model`: the plan document as typed values (quantities with units, qdisc stages, the run template,
    the matrix), dotted field paths into it, and the JSON Schema generated from it;
  - `expansion`: pure functions from a checked plan to its runs (matrix cells, one run template per cell,
    derived values, kernel-unit host and flow specs, run ids, the study table);
  - `checks`: everything that refuses a plan, at load time: YAML with positions, the validation passes
    and their rules, errors as FILE:LINE:COL.
`expand` trusts its input: a plan comes from `load_plan` / `load_plan_text`, or, built in Python, from
`check_plan`; it is never checked again.

Public API: `load_plan(path) -> Plan` (raises `PlanError` listing every problem as FILE:LINE:COL),
`expand(plan) -> list[RunSpec]`, `plan_sha256(path)`, the RunSpec models; the `tcplab plan ...` commands
live in `orchestrator.plan.commands`. See docs/plans.md for the format.
"""
from orchestrator.plan.checks.errors import Issue, PlanError
from orchestrator.plan.checks.loader import check_plan, load_plan, load_plan_text, plan_sha256
from orchestrator.plan.expansion.runs import expand
from orchestrator.plan.expansion.runspec import (
    AnalysisSpec,
    CapturePoint,
    Derived,
    FlowSpec,
    HostSpec,
    LinkRef,
    RunSpec,
    TopologySpec,
)
from orchestrator.plan.model.plan import Plan

__all__ = ["AnalysisSpec", "CapturePoint", "Derived", "FlowSpec", "HostSpec", "Issue", "LinkRef", "Plan", "PlanError",
           "RunSpec", "TopologySpec", "check_plan", "expand", "load_plan", "load_plan_text", "plan_sha256"]
