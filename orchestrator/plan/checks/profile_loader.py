"""Load a testbed profile file (model/profile.py): the plan's YAML reader (YAML 1.2 core, bounded, with
positions), the profile model, every problem as FILE:LINE:COL: field: message in one PlanError."""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.plan.checks.diagnose import problems_from
from orchestrator.plan.checks.errors import Marks, PlanError, locate_all
from orchestrator.plan.checks.loader import read_text
from orchestrator.plan.checks.yamlpos import read_yaml
from orchestrator.plan.model.profile import Profile

M = TypeVar("M", bound=BaseModel)


def validated_document(text: str, file: str, model: type[M]) -> tuple[M, Any, Marks]:
    """A YAML document read as plans are (bounded, with positions) and validated as `model`: the model, the raw
    document and its marks; PlanError with every field problem as FILE:LINE:COL. Profiles, campaigns and studies
    read their files through this."""
    doc, marks = read_yaml(text, file)
    try:
        return model.model_validate(doc), doc, marks
    except ValidationError as exc:
        raise PlanError(locate_all(problems_from(exc, doc, model), marks, file)) from None


def load_profile_text(text: str, file: str = "<profile>") -> Profile:
    return validated_document(text, file, Profile)[0]


def load_profile(path: str | Path) -> Profile:
    """Load and validate a profile file; raise PlanError listing every problem as FILE:LINE:COL."""
    return load_profile_text(read_text(path, "profile"), str(path))
