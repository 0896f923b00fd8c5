"""Load a study file: the plan reader (YAML 1.2 core, bounded, positions), the Study model, the rules that span
fields, then every plan expanded with the study's profile and narrowed to what the study replays. All problems
at once, each as FILE:LINE:COL: field.path: message, like plans and campaigns.

Where studies live: `experiments/<study>/study.yaml`; `tcplab study run NAME` finds them by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis.compare import METRIC_BY_KEY
from orchestrator.engine.selection import RunFilter, run_order, select_runs
from orchestrator.plan import PlanError, RunSpec, expand, load_plan
from orchestrator.plan.checks.errors import Problem, locate_all
from orchestrator.plan.checks.loader import read_text
from orchestrator.plan.checks.profile_loader import load_profile, validated_document
from orchestrator.plan.checks.yamlpos import read_yaml
from orchestrator.plan.model.profile import Profile
from orchestrator.study.model import STATISTICS, Study

EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "experiments"
STUDY_FILE = "study.yaml"
DEFAULT_PROFILE = EXPERIMENTS_DIR / "profiles" / "uml-lab.yaml"
MAX_RUNS = 5000     # runs one study may select (every repetition counted)


@dataclass(frozen=True)
class StudyPlan:
    """One plan of the study: where it is, and its selected runs as the profile adapts them (run order)."""

    name: str               # as the study file writes it
    path: Path
    runs: list[RunSpec]


@dataclass(frozen=True)
class LoadedStudy:
    study: Study
    path: Path
    profile_path: Path
    profile: Profile
    plans: dict[str, StudyPlan]


def study_problems(s: Study) -> list[Problem]:
    """Rules across fields: tables and comparisons name listed plans, metrics are known, each row has a paper
    value per column and the dimension the columns do not give, table ids are distinct."""
    out: list[Problem] = []
    plans = [p.plan for p in s.plans]
    out += [Problem(("plans", i, "plan"), "listed twice") for i, p in enumerate(plans) if p in plans[:i]]
    ids = [t.id for t in s.tables]
    out += [Problem(("tables", i, "id"), "another table has this id") for i, t in enumerate(ids) if t in ids[:i]]
    for what, items in (("tables", s.tables), ("comparisons", s.comparisons)):
        out += [Problem((what, i, "plan"), f"{item.plan!r} is not one of `plans:` ({', '.join(plans)})")
                for i, item in enumerate(items) if item.plan not in plans]
    for i, t in enumerate(s.tables):
        width = len(t.columns.values)
        if t.columns.by == "statistic":
            out += [Problem(("tables", i, "columns", "values", j), f"not a statistic ({', '.join(STATISTICS)})")
                    for j, v in enumerate(t.columns.values) if v not in STATISTICS]
        for j, row in enumerate(t.rows):
            where = ("tables", i, "rows", j)
            metric = row.metric or t.metric
            if metric not in METRIC_BY_KEY:
                out.append(Problem(where + ("metric",) if row.metric else ("tables", i, "metric"),
                                   f"unknown metric {metric!r}; known: {', '.join(sorted(METRIC_BY_KEY))}"))
            if len(row.paper) != width:
                out.append(Problem(where + ("paper",), f"{len(row.paper)} values for {width} columns"))
            if t.columns.by == "statistic" and row.statistic is not None:
                out.append(Problem(where + ("statistic",), "the columns are statistics: a row takes none"))
            for dim in ("experiment", "arm"):
                if t.columns.by == dim and getattr(row, dim) is not None:
                    out.append(Problem(where + (dim,), f"the columns are {dim}s: a row takes none"))
    return out


def _select(specs: list[RunSpec], entry_experiments: list[str], entry_arms: list[str],
            repetitions: int | None) -> list[RunSpec]:
    chosen = select_runs(run_order(specs), RunFilter(experiments=tuple(entry_experiments), arms=tuple(entry_arms)))
    return [s for s in chosen if repetitions is None or s.repetition < repetitions]


def _unknown(specs: list[RunSpec], field: str, wanted: list[str]) -> list[str]:
    have = {str(s.experiment) if field == "experiments" else str(s.params.get("arm")) for s in specs}
    return [w for w in wanted if w not in have]


def _plan_entry(s: Study, i: int, study_dir: Path, profile: Profile | None, problems: list[Problem]
                ) -> StudyPlan | None:
    entry = s.plans[i]
    path = (study_dir / entry.plan).resolve()
    try:
        plan = load_plan(path)
    except (PlanError, OSError) as exc:
        problems.append(Problem(("plans", i, "plan"), f"{path}: {exc}"))
        return None
    specs = expand(plan, profile=profile)
    if entry.repetitions is not None and entry.repetitions > plan.repetitions:
        problems.append(Problem(("plans", i, "repetitions"), f"the plan has {plan.repetitions} repetitions"))
    for field in ("experiments", "arms"):
        wanted = getattr(entry, field)
        for name in _unknown(specs, field, wanted):
            problems.append(Problem(("plans", i, field, wanted.index(name)), f"the plan has no {field[:-1]} {name!r}"))
    return StudyPlan(entry.plan, path, _select(specs, entry.experiments, entry.arms, entry.repetitions))


def load_study_text(text: str, file: str, study_dir: Path) -> LoadedStudy:
    s, _, marks = validated_document(text, file, Study)
    problems = study_problems(s)
    if problems:
        raise PlanError(locate_all(problems, marks, file))
    profile_path = (study_dir / s.profile).resolve() if s.profile else DEFAULT_PROFILE
    try:
        profile = load_profile(profile_path)
    except PlanError as exc:
        raise PlanError(locate_all([Problem(("profile",), f"{profile_path}: {exc}")], marks, file)) from None
    plans = {}
    for i in range(len(s.plans)):
        if (sp := _plan_entry(s, i, study_dir, profile, problems)) is not None:
            plans[sp.name] = sp
    total = sum(len(p.runs) for p in plans.values())
    if not problems and total > MAX_RUNS:
        problems.append(Problem(("plans",), f"{total} runs: more than {MAX_RUNS}"))
    if problems:
        raise PlanError(locate_all(problems, marks, file))
    return LoadedStudy(s, Path(file), profile_path, profile, plans)


def load_study(path: str | Path) -> LoadedStudy:
    """Load and check a study file and its plans; raise PlanError listing every problem as FILE:LINE:COL."""
    path = Path(path)
    return load_study_text(read_text(path, "study"), str(path), path.resolve().parent)


def study_path(name_or_path: str, root: Path = EXPERIMENTS_DIR) -> Path:
    """A study by name (`experiments/<name>/study.yaml`, or any study.yaml under `root` whose `name:` it is) or
    by path. FileNotFoundError naming what exists when there is no such study."""
    given = Path(name_or_path)
    if given.suffix in (".yaml", ".yml") or given.is_file():
        if not given.is_file():
            raise FileNotFoundError(f"no study file {given}")
        return given
    known = study_files(root)
    for path in known:
        if path.parent.name == name_or_path or _declared_name(path) == name_or_path:
            return path
    names = ", ".join(sorted(_declared_name(p) or p.parent.name for p in known)) or "none"
    raise FileNotFoundError(f"no study {name_or_path!r} (studies under {root}: {names})")


def study_files(root: Path = EXPERIMENTS_DIR) -> list[Path]:
    """Every experiments/<dir>/study.yaml, sorted."""
    return sorted(root.glob(f"*/{STUDY_FILE}"))


def _declared_name(path: Path) -> str | None:
    """The `name:` a study file declares, read without loading its plans (None when it cannot be read)."""
    try:
        doc, _ = read_yaml(read_text(path, "study"), str(path))
    except (PlanError, OSError):
        return None
    return str(doc.get("name")) if isinstance(doc, dict) and doc.get("name") else None
