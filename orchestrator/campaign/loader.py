"""Load a campaign file: the plan reader (YAML 1.2 core, bounded, positions), the Campaign model, the rules that
span fields, then every plan with every variant applied and checked. All problems at once, each as
FILE:LINE:COL: field.path: message — a plan that refuses a variant is reported at the variant (or the plan entry)
in the campaign file, with the plan's own message.

The result pairs, for every plan entry, each variant's runs of one repetition (the cell templates) by cell.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.compare import METRIC_BY_KEY
from orchestrator.campaign import cells
from orchestrator.campaign.model import Campaign
from orchestrator.plan import PlanError, RunSpec, expand
from orchestrator.plan.checks.errors import Problem, format_path, locate_all
from orchestrator.plan.checks.loader import read_text
from orchestrator.plan.checks.passes import check_document
from orchestrator.plan.checks.profile_loader import load_profile, validated_document
from orchestrator.plan.checks.yamlpos import read_yaml
from orchestrator.plan.expansion.matrix import all_assignments, target
from orchestrator.plan.model.paths import PathError
from orchestrator.plan.model.profile import Profile

MAX_CELLS = 2000   # cells per campaign (each runs ≥ 2 × repetitions.min trials a night)


@dataclass(frozen=True)
class Cell:
    """One cell: its key and label, and per variant the run spec of one repetition (the trial template)."""

    key: str
    label: str
    plan_index: int
    specs: dict[str, RunSpec]


@dataclass(frozen=True)
class PlanSource:
    index: int
    path: Path
    profile_path: Path | None
    row: dict[str, Any]                 # the `plan` table row (the file as written)
    kernels: dict[str, Any] = field(default_factory=dict)   # variant -> the plan's kernels with the variant's


@dataclass(frozen=True)
class LoadedCampaign:
    campaign: Campaign
    path: Path
    sha256: str
    text: str
    plans: list[PlanSource]
    cells: list[Cell]


def campaign_problems(c: Campaign) -> list[Problem]:
    """Rules across fields: the baseline names a vanilla kernel variant, checks name known metrics and candidates,
    overrides name run-template fields, variants keep distinct ids in run ids."""
    out: list[Problem] = []
    base = c.variants.get(c.baseline.variant)
    if base is None:
        out.append(Problem(("baseline", "variant"), f"{c.baseline.variant!r} is not one of the variants "
                           f"({', '.join(c.variants)})"))
    elif base.kernel is None or not base.kernel.vanilla:
        out.append(Problem(("variants", c.baseline.variant, "kernel"), "the baseline must name a vanilla kernel "
                           "(`kernel: {vanilla: true, ...}`): a campaign without a vanilla baseline is refused "
                           "(G-BASELINE)", at_key=base.kernel is None))
    elif base.overrides:
        out.append(Problem(("variants", c.baseline.variant, "overrides"), "the baseline runs the plans as written: "
                           "it takes no overrides"))
    ids: dict[str, str] = {}
    for name, v in c.variants.items():
        if (other := ids.setdefault(cells.variant_id(name), name)) != name:
            out.append(Problem(("variants", name), f"too close to {other!r}: run ids keep the first "
                               f"{cells.VARIANT_ID_CHARS} characters", at_key=True))
        for dotted in v.overrides:
            try:
                target(dotted)
            except PathError as exc:
                out.append(Problem(("variants", name, "overrides", dotted), str(exc), at_key=True))
    for i, check in enumerate(c.checks):
        metric = METRIC_BY_KEY.get(check.metric)
        if metric is None:
            out.append(Problem(("checks", i, "metric"), f"unknown metric {check.metric!r}; known: "
                               f"{', '.join(sorted(METRIC_BY_KEY))}"))
        elif metric.better is None and check.better is None:
            out.append(Problem(("checks", i), f"{check.metric} declares no better direction: give `better`",
                               at_key=True))
        elif metric.better is not None and check.better not in (None, metric.better):
            out.append(Problem(("checks", i, "better"), f"{check.metric} is better {metric.better}, declared once "
                               "with the metric"))
        for j, v in enumerate(check.variants):
            if v not in c.variants or v == c.baseline.variant:
                out.append(Problem(("checks", i, "variants", j), f"{v!r} is not a candidate variant"))
    return out


def _plan_document(path: Path) -> tuple[dict[str, Any], str]:
    text = read_text(path)
    doc, _ = read_yaml(text, str(path))
    if not isinstance(doc, dict):
        raise PlanError([])
    return doc, text


def _varied_paths(plan_doc: dict[str, Any]) -> set:
    """Run-template paths the plan itself varies (matrix, arms): a variant cannot set them, the plan's cell wins."""
    checked = check_document(plan_doc)
    return set() if checked.plan is None else {a.path for a in all_assignments(checked.plan)}


def _expand_entry(c: Campaign, i: int, campaign_dir: Path, problems: list[Problem]
                  ) -> tuple[PlanSource | None, dict[str, list[RunSpec]]]:
    entry = c.plans[i]
    where = ("plans", i)
    path = (campaign_dir / entry.plan).resolve()
    profile: Profile | None = None
    profile_path = (campaign_dir / entry.profile).resolve() if entry.profile else None
    try:
        doc, text = _plan_document(path)
        profile = load_profile(profile_path) if profile_path else None
    except PlanError as exc:
        problems.append(Problem(where + ("plan",), f"{path}: " + ("; ".join(str(x) for x in exc.issues)
                                                                 or "not a plan")))
        return None, {}
    row = {"plan_sha256": hashlib.sha256(text.encode()).hexdigest(), "name": str(doc.get("name", path.stem)),
           "path": str(path), "text": text}
    base_name, base = c.baseline.variant, c.variants[c.baseline.variant]
    source = PlanSource(i, path, profile_path, row)
    per_variant: dict[str, list[RunSpec]] = {}
    varied = _varied_paths(doc)
    for name, v in c.variants.items():
        kname = name if v.kernel is not None else base_name
        kernel = v.kernel if v.kernel is not None else base.kernel
        roles = list(v.roles or (base.roles if v.kernel is None else []))
        overrides = {target(d).path: value for d, value in v.overrides.items()}
        vdoc = cells.variant_document(doc, kname, cells.kernel_document(kernel, campaign_dir), roles, overrides)
        kernel_paths = {("hosts", r, "kernel") for r in roles or doc.get("roles") or []}
        conflicts = [".".join(map(str, p)) for p in varied & (set(overrides) | kernel_paths)]
        if conflicts:
            problems.append(Problem(("variants", name), f"plan {path.name} varies {', '.join(sorted(conflicts))} "
                                    "itself: a variant cannot set it", at_key=True))
            continue
        checked = check_document(vdoc)
        if checked.problems or checked.plan is None:
            problems += [Problem(("variants", name), f"plan {path.name} with this variant: {format_path(p.path)}: "
                                 f"{p.message}", at_key=True) for p in checked.problems[:5]]
            continue
        source.kernels[name] = checked.plan.kernels
        specs = expand(checked.plan.read_from(str(path.resolve().parent)), profile=profile)
        specs = [s for s in specs if s.repetition == 0
                 and (not entry.experiments or s.experiment in entry.experiments)
                 and (not entry.arms or s.params.get("arm") in entry.arms)]
        per_variant[name] = specs[:entry.cells] if entry.cells else specs
    return source, per_variant


def pair_cells(plan_index: int, per_variant: dict[str, list[RunSpec]], baseline: str) -> list[Cell]:
    """Cells keyed by the baseline's spec; every variant's spec of the same plan/experiment/arm/matrix cell."""
    by_match = {name: {cells.cell_match(s): s for s in specs} for name, specs in per_variant.items()}
    out = []
    for spec in per_variant.get(baseline, []):
        m = cells.cell_match(spec)
        specs = {name: found[m] for name, found in by_match.items() if m in found}
        out.append(Cell(cells.cell_key(spec), cells.cell_label(spec), plan_index, specs))
    return out


def load_campaign_text(text: str, file: str, campaign_dir: Path) -> LoadedCampaign:
    c, _, marks = validated_document(text, file, Campaign)
    problems = campaign_problems(c)
    if problems:
        raise PlanError(locate_all(problems, marks, file))
    sources, all_cells = [], []
    for i in range(len(c.plans)):
        source, per_variant = _expand_entry(c, i, campaign_dir, problems)
        if source is not None:
            sources.append(source)
            all_cells += pair_cells(i, per_variant, c.baseline.variant)
    if not problems and not all_cells:
        problems.append(Problem(("plans",), "the plans (as narrowed) give no cell"))
    if len(all_cells) > MAX_CELLS:
        problems.append(Problem(("plans",), f"{len(all_cells)} cells: more than {MAX_CELLS}"))
    if problems:
        raise PlanError(locate_all(problems, marks, file))
    return LoadedCampaign(c, Path(file), hashlib.sha256(text.encode()).hexdigest(), text, sources, all_cells)


def load_campaign(path: str | Path) -> LoadedCampaign:
    """Load and check a campaign file and its plans; raise PlanError listing every problem as FILE:LINE:COL."""
    path = Path(path)
    return load_campaign_text(read_text(path, "campaign"), str(path), path.resolve().parent)
