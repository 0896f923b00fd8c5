"""Load a plan file: read YAML with positions, run every validation pass, raise one PlanError with all issues.

This is where a plan is checked, once: `load_plan` / `load_plan_text` for plan files, `check_plan` for a
plan built in Python. The only module of the plan package that touches the filesystem.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from orchestrator.plan.checks.errors import Issue, Marks, PlanError, locate_all
from orchestrator.plan.checks.passes import check_document
from orchestrator.plan.checks.yamlpos import read_yaml
from orchestrator.plan.model.plan import Plan

MAX_PLAN_BYTES = 4 * 2**20


def load_plan_text(text: str, file: str = "<plan>") -> Plan:
    """Validate plan text; `file` is only used in error locations."""
    doc, marks = read_yaml(text, file)
    checked = check_document(doc)
    if checked.problems or checked.plan is None:
        raise PlanError(locate_all(checked.problems, marks, file))
    return checked.plan


def check_plan(plan: Plan) -> Plan:
    """Check a plan built in Python (`Plan.model_validate(...)`) as `load_plan` checks a file; raise
    PlanError (located at `<plan NAME>`, there is no text to point into) or return the checked plan."""
    checked = check_document(plan.model_dump(exclude_unset=True))
    if checked.problems or checked.plan is None:
        raise PlanError(locate_all(checked.problems, Marks({}, {}), f"<plan {plan.name}>"))
    return checked.plan


def _read(path: str | Path) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PlanError([Issue(str(path), 1, 1, (), f"cannot read the plan: {exc.strerror or exc}")]) from None
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError([Issue(str(path), 1, 1, (), f"the plan file is larger than {MAX_PLAN_BYTES} bytes")])
    return data


def load_plan(path: str | Path) -> Plan:
    """Load and validate a plan file; raise PlanError listing every problem as FILE:LINE:COL."""
    data = _read(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError([Issue(str(path), 1, 1, (), f"the plan is not UTF-8 text ({exc.reason} at byte "
                                                     f"{exc.start})")]) from None
    return load_plan_text(text, str(path))


def plan_sha256(path: str | Path) -> str:
    """Hex sha256 of the plan file's bytes (stored with every run of the plan)."""
    return hashlib.sha256(_read(path)).hexdigest()
