"""Load a testbed profile file (model/profile.py): the plan's YAML reader (YAML 1.2 core, bounded, with
positions), the profile model, every problem as FILE:LINE:COL: field: message in one PlanError."""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.plan.checks.diagnose import problems_from
from orchestrator.plan.checks.errors import Issue, Marks, PlanError, locate_all
from orchestrator.plan.checks.loader import load_plan, read_text
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
    """Load and validate a profile file; raise PlanError listing every problem as FILE:LINE:COL. A kernel rule's
    `build` is read here: the plan file it names (relative to the profile) must declare that variant."""
    profile, _, marks = validated_document(read_text(path, "profile"), str(path), Profile)
    rules, issues = [], []
    for i, rule in enumerate(profile.kernels):
        if rule.build is None:
            rules.append(rule)
            continue
        where = Path(path).resolve().parent / rule.build.plan
        field = ("kernels", i, "build")
        try:
            declared = load_plan(where).kernels
        except PlanError as exc:
            issues.append(Issue(str(path), *marks.locate(field + ("plan",)), field + ("plan",),
                                f"{rule.build.plan}: {exc.issues[0] if exc.issues else exc}"))
            continue
        variant = declared.get(rule.build.variant)
        if variant is None or variant.source is None:
            known = ", ".join(sorted(n for n, v in declared.items() if v.source is not None)) or "none"
            issues.append(Issue(str(path), *marks.locate(field + ("variant",)), field + ("variant",),
                                f"{rule.build.plan} declares no source variant {rule.build.variant!r} (it has: "
                                f"{known})"))
            continue
        rules.append(rule.with_stand_in(variant, str(where.parent)))
    if issues:
        raise PlanError(issues)
    return profile.model_copy(update={"kernels": rules})
