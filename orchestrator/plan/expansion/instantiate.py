"""Instantiating cells: one matrix cell applied to the run template gives one concrete run template.

A cell's assignments are written into the template document (plain values, as read from YAML) at their
canonical paths, and the result is built as a `RunTemplate`. The run's key hashes the whole instantiated
run with its experiment, arm and the plan's roles; it is the hash part of every run id of the cell.
The checks instantiate every cell the same way to find the problems of each run (checks/passes.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.plan.expansion.canon import digest
from orchestrator.plan.expansion.matrix import Assignment, Cell, iter_cells
from orchestrator.plan.model.paths import PathError, set_in
from orchestrator.plan.model.plan import Plan
from orchestrator.plan.model.template import RunTemplate


@dataclass(frozen=True)
class CellRun:
    """One cell of a plan made concrete: the cell, its run template and its key (part of the run ids)."""

    cell: Cell
    run: RunTemplate
    key: str            # short hash of the instantiated run (with experiment, arm and roles)


class CellValueError(PathError):
    """A value of a cell that the template document has no place for (e.g. an index beyond a list)."""

    def __init__(self, assignment: Assignment, message: str) -> None:
        super().__init__(message)
        self.assignment = assignment


def template_document(cell: Cell, template_doc: Any) -> Any:
    """The run template document with the cell's values written in (raises CellValueError)."""
    doc = template_doc
    for a in cell.assignments:
        try:
            doc = set_in(doc, a.path, a.value)
        except PathError as exc:
            raise CellValueError(a, str(exc)) from None
    return doc


def instantiate(cell: Cell, template_doc: Any) -> RunTemplate:
    """The run template of one cell (raises CellValueError or pydantic's ValidationError when the cell's
    values do not make a valid run; a checked plan has no such cell)."""
    return RunTemplate.model_validate(template_document(cell, template_doc))


def run_key(plan: Plan, cell: Cell, run: RunTemplate, profile_sha: str | None = None) -> str:
    """The hash part of a run id: the whole instantiated run, not only the varied values, so an id names
    one configuration for good; a run a testbed profile adapted also hashes the profile (its kernels)."""
    # a stated topology is part of the run; the default one is not hashed, so it keeps the ids plans had
    # before topologies could be stated (it follows from the roles, which are hashed)
    stated = {"topology": plan.topology} if plan.topology is not None else {}
    adapted = {"profile": profile_sha} if profile_sha is not None else {}
    return digest({"experiment": cell.experiment, "arm": cell.arm, "roles": plan.roles, "run": run, **stated,
                   **adapted})


def instantiate_all(plan: Plan) -> list[CellRun]:
    """Every cell of a checked plan, in plan order."""
    template_doc = plan.model_dump(exclude_unset=True)["run"]
    out = []
    for cell in iter_cells(plan):
        run = instantiate(cell, template_doc)
        out.append(CellRun(cell, run, run_key(plan, cell, run)))
    return out
