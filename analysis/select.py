"""Selectors: which runs a report or comparison is about, named by run id, plan, tag or experiment.

A selector is `KIND:NAME` or a bare NAME:
  run:ID            one run (any status)
  plan:NAME         every complete run of a plan (run.plan_name)
  tag:TAG           every complete run carrying the tag (run.tags: the plan's tags and the testbed's)
  experiment:[PLAN/]NAME   every complete run of an experiment (optionally of one plan)
A bare NAME is tried as a run id, then a plan name, then a tag, then an experiment, and the
first kind that matches wins. Errors are values (SelectorError with the selector) raised here and
shown once by the CLI.
"""
from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from orchestrator.storage import tables as T

KINDS = ("run", "plan", "tag", "experiment")


class SelectorError(ValueError):
    """A selector that names no run (or a malformed one); str() is the message for the user."""

    def __init__(self, selector: str, message: str):
        super().__init__(f"{selector!r}: {message}")
        self.selector = selector


@dataclass(frozen=True)
class Selection:
    """The runs a selector resolved to, in run_id order (for a run id: that run)."""

    selector: str
    kind: str
    name: str
    run_ids: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class _RunIndex:
    """The few columns of every run a selector is matched against (the run table is small)."""

    run_id: str
    status: str
    plan_name: str
    experiment: str
    tags: tuple[str, ...]


def _index(engine: Engine) -> list[_RunIndex]:
    r = T.run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(r.c.run_id, r.c.status, r.c.plan_name, r.c.experiment, r.c.tags)
                            .order_by(r.c.run_id)).all()
    return [_RunIndex(x.run_id, x.status, x.plan_name, x.experiment, tuple(str(t) for t in x.tags or ()))
            for x in rows]


def _matches(kind: str, name: str, run: _RunIndex) -> bool:
    if kind == "run":
        return run.run_id == name
    if run.status != "complete":          # failed runs hold partial data; ask for them by id
        return False
    if kind == "plan":
        return run.plan_name == name
    if kind == "tag":
        return name in run.tags
    plan, _, exp = name.rpartition("/")
    return run.experiment == exp and (not plan or run.plan_name == plan)


def select(engine: Engine, selector: str) -> Selection:
    """The runs a selector names; SelectorError if it names none or its kind is unknown."""
    kind, sep, name = selector.partition(":")
    if sep and kind in KINDS:
        kinds = [kind]
    elif sep:
        raise SelectorError(selector, f"unknown selector kind {kind!r}; use one of {', '.join(KINDS)}")
    else:
        kinds, name = list(KINDS), selector
    if not name:
        raise SelectorError(selector, "empty name")
    runs = _index(engine)
    for k in kinds:
        ids = tuple(r.run_id for r in runs if _matches(k, name, r))
        if ids:
            return Selection(selector, k, name, ids)
    what = kinds[0] if len(kinds) == 1 else "run id, plan, tag or experiment"
    raise SelectorError(selector, f"no {what} of that name with complete runs in the database "
                                  f"({len(runs)} runs stored)")


def select_all(engine: Engine, selectors: list[str]) -> list[str]:
    """Run ids of several selectors, in selector order, each run once."""
    out: list[str] = []
    for s in selectors:
        out += [i for i in select(engine, s).run_ids if i not in out]
    return out
