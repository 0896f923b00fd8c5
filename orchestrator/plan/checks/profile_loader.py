"""Load a testbed profile file (model/profile.py): the plan's YAML reader (YAML 1.2 core, bounded, with
positions), the profile model, every problem as FILE:LINE:COL: field: message in one PlanError."""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from orchestrator.plan.checks.diagnose import problems_from
from orchestrator.plan.checks.errors import PlanError, locate_all
from orchestrator.plan.checks.loader import read_text
from orchestrator.plan.checks.yamlpos import read_yaml
from orchestrator.plan.model.profile import Profile


def load_profile_text(text: str, file: str = "<profile>") -> Profile:
    doc, marks = read_yaml(text, file)
    try:
        return Profile.model_validate(doc)
    except ValidationError as exc:
        raise PlanError(locate_all(problems_from(exc, doc, Profile), marks, file)) from None


def load_profile(path: str | Path) -> Profile:
    """Load and validate a profile file; raise PlanError listing every problem as FILE:LINE:COL."""
    return load_profile_text(read_text(path, "profile"), str(path))
