"""Rules that relate fields to each other, each reported at the field a researcher has to change.

Two groups: `assignment_problems` (every varied value names a real field and fits its type; works on
the raw document so it runs even when other parts of the plan are broken) and `plan_problems` (names,
arms, matrix shape, conflicting assignments). The rules of one instantiated run are in `run_rules.py`.
All return `Problem`s; none raises.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from orchestrator.plan.checks.diagnose import problems_from
from orchestrator.plan.checks.errors import Problem, format_path
from orchestrator.plan.checks.ktrace_rules import timing_tag_problems
from orchestrator.plan.checks.topology_rules import graph_problems
from orchestrator.plan.expansion.matrix import (
    Assignment,
    adapter,
    all_assignments,
    param_name,
    runs_by_view,
    target,
    value_key,
    views,
)
from orchestrator.plan.model.bounds import MAX_RUNS
from orchestrator.plan.model.paths import KeyPath, PathError
from orchestrator.plan.model.plan import Plan
from orchestrator.plan.model.template import ALL_HOSTS

RESERVED_PARAMS = frozenset({"arm", "experiment", "repetition"})


# ------------------------------------------------------------------ assignments (raw document)

def _items(section: Any, key_origin: KeyPath, indexed: bool) -> Iterator[tuple[str, Any, KeyPath, KeyPath]]:
    """(dotted, value, value path, key path) of a `set`-like mapping or an `axes`-like mapping of lists."""
    if not isinstance(section, dict):
        return
    for dotted, value in section.items():
        if not isinstance(dotted, str):
            continue  # the model reports non-string keys
        key_path = key_origin + (dotted,)
        if indexed:
            for k, v in enumerate(value if isinstance(value, list) else []):
                yield dotted, v, key_path + (k,), key_path
        else:
            yield dotted, value, key_path, key_path


def _matrix_items(m: Any, origin: KeyPath) -> Iterator[tuple[str, Any, KeyPath, KeyPath]]:
    if not isinstance(m, dict):
        return
    yield from _items(m.get("axes"), origin + ("axes",), True)
    for g, group in enumerate(m.get("zip") if isinstance(m.get("zip"), list) else []):
        yield from _items(group, origin + ("zip", g), True)
    for name in ("include", "exclude"):
        for n, entry in enumerate(m.get(name) if isinstance(m.get(name), list) else []):
            yield from _items(entry, origin + (name, n), False)


def _assignment_items(doc: Any) -> Iterator[tuple[str, Any, KeyPath, KeyPath]]:
    if not isinstance(doc, dict):
        return
    yield from _matrix_items(doc.get("matrix"), ("matrix",))
    for i, arm in enumerate(doc.get("arms") if isinstance(doc.get("arms"), list) else []):
        if isinstance(arm, dict):
            yield from _items(arm.get("set"), ("arms", i, "set"), False)
    for i, exp in enumerate(doc.get("experiments") if isinstance(doc.get("experiments"), list) else []):
        if isinstance(exp, dict):
            yield from _items(exp.get("set"), ("experiments", i, "set"), False)
            yield from _matrix_items(exp.get("matrix"), ("experiments", i, "matrix"))


def assignment_problems(doc: Any) -> list[Problem]:
    """Every varied value must name a field of the run template and be a valid value for it."""
    out: list[Problem] = []
    bad_keys: set[KeyPath] = set()
    names = doc.get("param_names") if isinstance(doc, dict) else None
    for dotted in names if isinstance(names, dict) else {}:
        if isinstance(dotted, str):
            try:
                target(dotted)
            except PathError as exc:
                out.append(Problem(("param_names", dotted), str(exc), at_key=True))
    for dotted, value, value_path, key_path in _assignment_items(doc):
        try:
            ta = adapter(dotted)
        except PathError as exc:
            if key_path not in bad_keys:
                bad_keys.add(key_path)
                out.append(Problem(key_path, str(exc), at_key=True))
            continue
        if ta is None:
            continue
        try:
            ta.validate_python(value)
        except ValidationError as exc:
            out += [Problem(value_path + p.path, p.message, p.at_key)
                    for p in problems_from(exc, value, target(dotted).annotation)]
    return out


# ------------------------------------------------------------------ plan-level rules (typed plan)

def _duplicates(names: list[str], prefix: KeyPath, what: str) -> list[Problem]:
    first: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        if name in first:
            out.append(Problem(prefix + (i, "name"), f"duplicate {what} name {name!r} (also "
                               f"{format_path(prefix + (first[name],))})"))
        first.setdefault(name, i)
    return out


def _repeated(keys: list[str], path: KeyPath) -> list[Problem]:
    """A value listed twice on one axis would run the same cell twice."""
    first: dict[str, int] = {}
    out = []
    for k, key in enumerate(keys):
        if key in first:
            out.append(Problem(path + (k,), f"same value as [{first[key]}] (compared in kernel units)"))
        first.setdefault(key, k)
    return out


def _matrix_shape(plan: Plan) -> list[Problem]:
    out: list[Problem] = []
    seen_origins: set[KeyPath] = set()
    for view in views(plan):
        m, origin = view.matrix, view.matrix_origin
        if origin in seen_origins:
            continue
        seen_origins.add(origin)
        varied: dict[KeyPath, KeyPath] = {}
        for d, values in m.axes.items():
            varied.setdefault(target(d).path, origin + ("axes", d))
            out += _repeated([value_key(Assignment(d, (), v, ())) for v in values], origin + ("axes", d))
        for g, group in enumerate(m.zip):
            rows = list(zip(*(([value_key(Assignment(d, (), v, ())) for v in vs]) for d, vs in group.items()),
                            strict=False))
            out += _repeated([repr(r) for r in rows], origin + ("zip", g, next(iter(group), "")))
        for g, group in enumerate(m.zip):
            if not group:
                out.append(Problem(origin + ("zip", g), "a zip group needs at least one field"))
            lengths = {d: len(v) for d, v in group.items()}
            first = next(iter(lengths), None)
            for d, n in lengths.items():
                if first is not None and n != lengths[first]:
                    out.append(Problem(origin + ("zip", g, d), f"has {n} values but {first!r} has "
                                       f"{lengths[first]}; zipped lists vary together and must be equally long"))
            for d in group:
                p = target(d).path
                if p in varied:
                    out.append(Problem(origin + ("zip", g, d), f"also varied by {format_path(varied[p])}",
                                       at_key=True))
                varied.setdefault(p, origin + ("zip", g, d))
        for n, entry in enumerate(m.exclude):
            for d in entry:
                if target(d).path not in varied:
                    out.append(Problem(origin + ("exclude", n, d), "exclude can only name the matrix's axes "
                                       "and zip fields", at_key=True))
    return out


def _conflicts(plan: Plan) -> list[Problem]:
    """A field set at two levels (experiment, arm, matrix) would silently lose one value."""
    out: list[Problem] = []
    for view in views(plan):
        m = view.matrix
        matrix_paths: dict[KeyPath, KeyPath] = {}
        for d in m.axes:
            matrix_paths.setdefault(target(d).path, view.matrix_origin + ("axes", d))
        for g, group in enumerate(m.zip):
            for d in group:
                matrix_paths.setdefault(target(d).path, view.matrix_origin + ("zip", g, d))
        for n, entry in enumerate(m.include):
            for d in entry:
                matrix_paths.setdefault(target(d).path, view.matrix_origin + ("include", n, d))
        arm_paths = {target(d).path: ("arms", j, "set", d) for j, arm in view.arms for d in arm.set}
        for a in view.sets:
            for other in (arm_paths, matrix_paths):
                if a.path in other:
                    out.append(Problem(a.origin, f"also set by {format_path(other[a.path])}", at_key=True))
        for p, origin in arm_paths.items():
            if p in matrix_paths:
                out.append(Problem(origin, f"also set by {format_path(matrix_paths[p])}", at_key=True))
    return out


def _param_names(plan: Plan) -> list[Problem]:
    paths_by_name: dict[str, dict[KeyPath, Assignment]] = defaultdict(dict)
    for a in all_assignments(plan):
        paths_by_name[param_name(plan, a.dotted)].setdefault(a.path, a)
    out = []
    for name, by_path in paths_by_name.items():
        if name in RESERVED_PARAMS:
            first = next(iter(by_path.values()))
            out.append(Problem(first.origin, f"the param name {name!r} is reserved; rename it in "
                               "param_names", at_key=True))
        if len(by_path) > 1:
            dotted = sorted(a.dotted for a in by_path.values())
            for a in by_path.values():
                out.append(Problem(a.origin, f"param name {name!r} would stand for {' and '.join(dotted)}; "
                                   "give one of them a name in param_names", at_key=True))
    return out


def plan_problems(plan: Plan) -> list[Problem]:
    """Plan-wide rules. Assumes assignment_problems found nothing (every dotted path names a field)."""
    by_view = runs_by_view(plan)   # arithmetic, before any cell is built: a typo must not expand for minutes
    total = sum(n for _, n in by_view)
    if total > MAX_RUNS:
        largest = max(by_view, key=lambda vn: vn[1])[0]
        return [Problem(largest.matrix_origin, f"the plan expands to up to {total} runs, more than {MAX_RUNS} "
                        "(the product of the axis lengths x arms x repetitions; docs/plans.md#limits)")]
    out = _duplicates([e.name for e in plan.experiments], ("experiments",), "experiment")
    out += _duplicates([a.name for a in plan.arms], ("arms",), "arm")
    if len(set(plan.roles)) != len(plan.roles) or ALL_HOSTS in plan.roles:
        out.append(Problem(("roles",), f"roles must be distinct and not {ALL_HOSTS!r}"))
    arm_names = [a.name for a in plan.arms]
    for i, exp in enumerate(plan.experiments):
        for k, name in enumerate(exp.arms or []):
            if name not in arm_names:
                out.append(Problem(("experiments", i, "arms", k), f"no arm named {name!r} (arms: "
                                   f"{', '.join(arm_names) or 'none'})"))
    out += _matrix_shape(plan) + _conflicts(plan) + _param_names(plan) + graph_problems(plan)
    out += timing_tag_problems(plan)
    return out
