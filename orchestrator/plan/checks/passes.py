"""The validation passes over a plan document, collecting every problem before giving up.

1. the plan model (structure, types, units of the template);  2. every varied value against the field
it sets (runs even if pass 1 failed elsewhere);  3. plan-wide rules;  4. every cell instantiated into a
run template (as the expansion does it) and checked as a run. Problems found in an instantiated run are
mapped back to where the offending value was written (the axis value, the experiment's `set`, or the
template), and a problem shared by many cells is reported once with a count.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from orchestrator.plan.checks.agent_limits import flow_count
from orchestrator.plan.checks.diagnose import problems_from
from orchestrator.plan.checks.errors import Problem
from orchestrator.plan.checks.plan_rules import assignment_problems, plan_problems
from orchestrator.plan.checks.run_rules import run_problems
from orchestrator.plan.checks.topology_rules import link_problems
from orchestrator.plan.expansion.instantiate import CellValueError, run_key, template_document
from orchestrator.plan.expansion.matrix import Cell, iter_cells
from orchestrator.plan.model.bounds import MAX_PLAN_FLOWS
from orchestrator.plan.model.paths import KeyPath
from orchestrator.plan.model.plan import Plan
from orchestrator.plan.model.template import RunTemplate
from orchestrator.plan.model.topology import plan_graph


@dataclass
class Checked:
    """The outcome of the passes: the typed plan (None when the document is not a plan) and every problem."""

    plan: Plan | None
    problems: list[Problem] = field(default_factory=list)


def describe(cell: Cell) -> str:
    parts = [f"experiment {cell.experiment}"] + ([f"arm {cell.arm}"] if cell.arm else [])
    parts += [f"{a.dotted}={a.value}" for a in cell.assignments if isinstance(a.value, (str, int, float))]
    return ", ".join(parts)


def _to_plan(path: KeyPath, cell: Cell) -> KeyPath:
    """Where in the plan document a path of the instantiated run was written."""
    best = None
    for a in cell.assignments:
        if path[:len(a.path)] == a.path and (best is None or len(a.path) >= len(best.path)):
            best = a
    return best.origin + path[len(best.path):] if best else ("run",) + path


def check_cell(plan: Plan, template_doc: Any, cell: Cell) -> tuple[RunTemplate | None, list[Problem]]:
    """The run template of one cell, or the problems (in plan-document paths) that prevent it, plus the
    problems of the run it makes."""
    try:
        doc = template_document(cell, template_doc)
    except CellValueError as exc:
        return None, [Problem(exc.assignment.origin, str(exc))]
    try:
        run = RunTemplate.model_validate(doc)
    except ValidationError as exc:
        return None, [Problem(_to_plan(p.path, cell), p.message, p.at_key)
                      for p in problems_from(exc, doc, RunTemplate)]
    return run, [Problem(_to_plan(p.path, cell), p.message, p.at_key)
                 for p in run_problems(run, plan.roles, set(plan.kernels))
                 + link_problems(run, plan_graph(plan.roles, plan.topology))]


def check_cells(plan: Plan, template_doc: Any) -> list[Problem]:
    """The problems of every cell's run; problems shared by several cells are merged into one with a count,
    and two cells that give the same run are a problem too."""
    found: dict[Problem, list[Cell]] = defaultdict(list)
    seen: dict[str, Cell] = {}
    cells = list(iter_cells(plan))
    flows = 0
    for cell in cells:
        run, problems = check_cell(plan, template_doc, cell)
        for p in problems:
            found[p].append(cell)
        if run is None:
            continue
        flows += flow_count(run)
        if flows > MAX_PLAN_FLOWS:   # checking a run costs about its flows; stop before that adds up to minutes
            return [Problem(("matrix",), f"the plan's cells have more than {MAX_PLAN_FLOWS} flows in all "
                            f"(reached at {describe(cell)}; docs/plans.md#limits)")]
        key = run_key(plan, cell, run)
        if key in seen:
            origin = cell.assignments[-1].origin if cell.assignments else ("matrix",)
            found[Problem(origin, f"gives the same run as another cell ({describe(seen[key])})")].append(cell)
            continue
        seen[key] = cell
    out = []
    for p, where in found.items():
        if len(cells) > 1 and len(where) < len(cells):
            extra = f" (in {len(where)} of {len(cells)} cells, e.g. {describe(where[0])})"
            p = Problem(p.path, p.message + extra, p.at_key)
        out.append(p)
    return out


def _template_problems(doc: Any) -> list[Problem]:
    """Run rules on the bare template, so a broken matrix does not hide a flow longer than the run."""
    if not isinstance(doc, dict):
        return []
    try:
        run = RunTemplate.model_validate(doc.get("run"))
    except ValidationError:
        return []  # already reported by the plan model
    roles = doc.get("roles")
    if not (isinstance(roles, list) and roles and all(isinstance(r, str) for r in roles)):
        roles = list(Plan.model_fields["roles"].default)
    return [Problem(("run",) + p.path, p.message, p.at_key) for p in run_problems(run, roles)]


def check_document(doc: Any) -> Checked:
    """Run every pass over a raw plan document (plain dicts/lists as read from YAML)."""
    problems: list[Problem] = []
    plan = None
    try:
        plan = Plan.model_validate(doc)
    except ValidationError as exc:
        problems += problems_from(exc, doc, Plan)
    problems += assignment_problems(doc)
    if plan is None or problems:
        return Checked(plan, problems + _template_problems(doc))
    problems = plan_problems(plan)
    if problems:
        return Checked(plan, problems)
    return Checked(plan, check_cells(plan, doc["run"]))
