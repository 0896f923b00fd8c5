"""Matrix expansion: from a plan to its cells (experiment, arm, and the field values that define a run).

A cell is a list of assignments (canonical field path, value, and where in the plan the value was
written, so a problem found later points at that line). Order is deterministic: experiments in plan
order, then arms, then the product of the axes (first axis slowest) and zip groups, then `include`.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from orchestrator.plan.expansion.canon import canonical_json
from orchestrator.plan.model.paths import KeyPath, Target, parse_field_path
from orchestrator.plan.model.plan import DEFAULT_EXPERIMENT, Arm, Matrix, Plan
from orchestrator.plan.model.template import RunTemplate


@dataclass(frozen=True)
class Assignment:
    dotted: str          # the path as written
    path: KeyPath           # canonical path into the run template
    value: Any           # the value as written (JSON-able)
    origin: KeyPath         # where the value sits in the plan document


@dataclass(frozen=True)
class View:
    """One experiment as the matrix sees it."""

    name: str
    origin: KeyPath                                   # plan path of the experiment (() for the implicit one)
    sets: tuple[Assignment, ...]
    matrix: Matrix
    matrix_origin: KeyPath
    arms: tuple[tuple[int, Arm], ...]              # (index in plan.arms, arm)
    repetitions: int


@dataclass(frozen=True)
class Cell:
    experiment: str
    arm: str | None
    assignments: tuple[Assignment, ...]
    repetitions: int
    index: int = 0          # which matrix cell of the experiment (the same for every arm)


@lru_cache(maxsize=4096)
def target(dotted: str) -> Target:
    """Resolve a dotted path against the run template (cached; raises PathError)."""
    return parse_field_path(RunTemplate, dotted)


@lru_cache(maxsize=4096)
def adapter(dotted: str) -> TypeAdapter[Any] | None:
    annotation = target(dotted).annotation
    return None if annotation is None else TypeAdapter(annotation)


def assign(dotted: str, value: Any, origin: KeyPath) -> Assignment:
    return Assignment(dotted, target(dotted).path, value, origin)


def value_key(a: Assignment) -> str:
    """Canonical text of an assignment's value: `20Mbit` and `20mbit` give the same key."""
    ta = adapter(a.dotted)
    try:
        return canonical_json(ta.validate_python(a.value) if ta else a.value)
    except ValidationError:
        return canonical_json(a.value)


def views(plan: Plan) -> list[View]:
    def arm_list(names: list[str] | None) -> tuple[tuple[int, Arm], ...]:
        indexed = list(enumerate(plan.arms))
        if names is None:
            return tuple(indexed)
        by_name = {arm.name: (i, arm) for i, arm in indexed}
        return tuple(by_name[n] for n in names if n in by_name)

    if not plan.experiments:
        return [View(DEFAULT_EXPERIMENT, (), (), plan.matrix, ("matrix",), arm_list(None), plan.repetitions)]
    out = []
    for i, exp in enumerate(plan.experiments):
        origin: KeyPath = ("experiments", i)
        sets = tuple(assign(d, v, origin + ("set", d)) for d, v in exp.set.items())
        matrix, m_origin = ((exp.matrix, origin + ("matrix",)) if exp.matrix is not None
                            else (plan.matrix, ("matrix",)))
        out.append(View(exp.name, origin, sets, matrix, m_origin, arm_list(exp.arms),
                        exp.repetitions or plan.repetitions))
    return out


def _groups(matrix: Matrix, origin: KeyPath) -> list[list[tuple[Assignment, ...]]]:
    groups = [[(assign(d, v, origin + ("axes", d, k)),) for k, v in enumerate(values)]
              for d, values in matrix.axes.items()]
    for g, group in enumerate(matrix.zip):
        n = min(len(values) for values in group.values()) if group else 0
        groups.append([tuple(assign(d, values[k], origin + ("zip", g, d, k)) for d, values in group.items())
                       for k in range(n)])
    return groups


def _exclusions(entries: list[dict[str, Any]]) -> dict[tuple[KeyPath, ...], set[tuple[str, ...]]]:
    """Exclude entries by the fields they name: (field paths) -> the value keys excluded together, so a
    cell is tested once per distinct set of fields, not once per entry (a matrix may list many)."""
    out: dict[tuple[KeyPath, ...], set[tuple[str, ...]]] = defaultdict(set)
    for entry in entries:
        pairs = sorted({target(d).path: value_key(Assignment(d, target(d).path, v, ())) for d, v in entry.items()}
                       .items())
        out[tuple(p for p, _ in pairs)].add(tuple(k for _, k in pairs))
    return out


def matrix_cells(matrix: Matrix, origin: KeyPath) -> list[tuple[Assignment, ...]]:
    """Product of axes and zip groups, minus excluded cells, plus included ones; duplicates dropped."""
    groups = _groups(matrix, origin)
    keys: dict[int, str] = {}   # value_key of each assignment, computed once (cells share assignments)

    def key_of(a: Assignment) -> str:
        if id(a) not in keys:
            keys[id(a)] = value_key(a)
        return keys[id(a)]

    if groups:
        base = [sum(combo, ()) for combo in itertools.product(*groups)]
    else:
        base = [] if matrix.include else [()]
    excluded = _exclusions(matrix.exclude)

    def is_excluded(cell: tuple[Assignment, ...]) -> bool:
        by_path = {a.path: a for a in cell}
        return any(all(p in by_path for p in paths) and tuple(key_of(by_path[p]) for p in paths) in values
                   for paths, values in excluded.items())

    kept = [c for c in base if not is_excluded(c)]
    kept += [tuple(assign(d, v, origin + ("include", n, d)) for d, v in entry.items())
             for n, entry in enumerate(matrix.include)]
    seen: set[tuple[tuple[str, str], ...]] = set()
    out = []
    for cell in kept:
        key = tuple(sorted((repr(a.path), key_of(a)) for a in cell))
        if key not in seen:
            seen.add(key)
            out.append(cell)
    return out


def runs_by_view(plan: Plan) -> list[tuple[View, int]]:
    """Upper bound of each experiment's number of runs, by arithmetic: the product of its axis lengths (zip
    groups count once), plus its includes, times arms and repetitions; no cell is built (guards MAX_RUNS)."""
    out = []
    for view in views(plan):
        m = view.matrix
        sizes = [len(v) for v in m.axes.values()] + [min((len(v) for v in g.values()), default=0)
                                                      for g in m.zip]
        cells = (math.prod(sizes) if sizes else (0 if m.include else 1)) + len(m.include)
        out.append((view, cells * max(1, len(view.arms)) * view.repetitions))
    return out


def count_runs(plan: Plan) -> int:
    """Upper bound of the number of runs, computed without expanding (guards MAX_RUNS)."""
    return sum(n for _, n in runs_by_view(plan))


def iter_cells(plan: Plan) -> Iterator[Cell]:
    for view in views(plan):
        cells = matrix_cells(view.matrix, view.matrix_origin)
        arms: list[tuple[int, Arm] | None] = list(view.arms) or [None]
        for arm_entry in arms:
            arm_sets: tuple[Assignment, ...] = ()
            if arm_entry is not None:
                j, arm = arm_entry
                arm_sets = tuple(assign(d, v, ("arms", j, "set", d)) for d, v in arm.set.items())
            for k, cell in enumerate(cells):
                yield Cell(view.name, arm_entry[1].name if arm_entry else None,
                           view.sets + arm_sets + cell, view.repetitions, k)


def all_assignments(plan: Plan) -> Iterator[Assignment]:
    """Every field the plan assigns (experiment sets, matrix axes, zip groups and includes, arms), each with
    where it is written; only experiment sets carry their value (the others are lists or vary per cell)."""
    for view in views(plan):
        yield from view.sets
        m, o = view.matrix, view.matrix_origin
        yield from (Assignment(d, target(d).path, None, o + ("axes", d)) for d in m.axes)
        yield from (Assignment(d, target(d).path, None, o + ("zip", g, d))
                    for g, group in enumerate(m.zip) for d in group)
        yield from (Assignment(d, target(d).path, None, o + ("include", n, d))
                    for n, entry in enumerate(m.include) for d in entry)
    yield from (Assignment(d, target(d).path, None, ("arms", j, "set", d))
                for j, arm in enumerate(plan.arms) for d in arm.set)


def param_name(plan: Plan, dotted: str) -> str:
    """Name of a varied field in the run params: `param_names` or the last path segment."""
    return plan.param_names.get(dotted, dotted.rsplit(".", 1)[-1])
