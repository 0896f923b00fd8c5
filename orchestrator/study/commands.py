"""`tcplab study list | dry-run | run | report NAME` (docs/studies.md). Thin: loading is study/loader.py, cells and
verdicts study/cells.py, the page study/page.py; the labs and runs are the ones `tcplab lab up` and `tcplab run`
use.

`run` brings up the lab each plan needs (the profile's kind; the UML lab by default) unless an inventory is
given, runs every selected run not yet stored complete (so an interrupted study resumes where it stopped), then
writes the report. Exit codes: 0 every selected run complete, 1 a run failed, 2 a study, plan or lab error,
3 runs refused (none failed).
"""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _load(target: str, console: Console):
    from orchestrator.plan import PlanError
    from orchestrator.study.loader import load_study, study_path

    try:
        return load_study(study_path(target))
    except (PlanError, FileNotFoundError) as exc:
        console.print(str(exc), markup=False, soft_wrap=True)
        return None


def cmd_list(console: Console) -> int:
    from orchestrator.plan import PlanError
    from orchestrator.study.loader import load_study, study_files

    t = Table(title="studies (experiments/*/study.yaml)")
    for col in ("name", "title", "plans", "runs", "tables", "cells"):
        t.add_column(col)
    for path in study_files():
        try:
            ls = load_study(path)
        except PlanError as exc:
            t.add_row(path.parent.name, f"[red]does not load: {str(exc).splitlines()[0]}[/red]", "", "", "", "")
            continue
        s = ls.study
        t.add_row(s.name, s.title, str(len(ls.plans)), str(sum(len(p.runs) for p in ls.plans.values())),
                  str(len(s.tables)), str(sum(len(tb.rows) * len(tb.columns.values) for tb in s.tables)))
    console.print(t)
    return 0


def _selection(ls, name: str):
    from orchestrator.engine.selection import RunFilter

    entry = next(p for p in ls.study.plans if p.plan == name)
    reps = tuple(sorted({s.repetition for s in ls.plans[name].runs}))
    return RunFilter(experiments=tuple(entry.experiments), arms=tuple(entry.arms), repetitions=reps)


def _erased(ls) -> dict[str, list]:
    from orchestrator.study.cells import erased_comparisons

    return {name: erased_comparisons([c for c in ls.study.comparisons if c.plan == name], sp.runs)
            for name, sp in ls.plans.items()}


def cmd_dry_run(args: argparse.Namespace, console: Console) -> int:
    """What the study would run on its profile's testbed: per plan the selected runs, the comparisons the
    profile erases (loudly), then each plan's own dry run when a lab with its inventory is up."""
    ls = _load(args.study, console)
    if ls is None:
        return 2
    console.print(f"study {ls.study.name}: {ls.study.title}\nprofile {ls.profile.name} ({ls.profile_path})",
                  markup=False)
    for name, erased in _erased(ls).items():
        console.print(f"plan {name}: {len(ls.plans[name].runs)} runs selected", markup=False)
        _say_erased(console, erased)
    if args.inventory is None:
        console.print("per-run verdicts need a lab's capabilities: `tcplab study run` brings the labs up; with one "
                      "up, `tcplab study dry-run NAME --inventory PATH`", markup=False)
        return 0
    return _each_plan(ls, args, console, dry=True)


def _each_plan(ls, args: argparse.Namespace, console: Console, dry: bool) -> int:
    """Each plan's runs (or dry run) on its lab, in the study's order; the study's exit code."""
    from orchestrator.engine.plan_run import run_plan
    from orchestrator.study.labs import StudyLabs

    worst = 0
    with StudyLabs(ls, args.inventory, console) as labs:
        for name, sp in ls.plans.items():
            inventory = labs.inventory_for(sp.path)
            if inventory is None:
                worst = _worse(worst, 2)
                continue
            rc = asyncio.run(run_plan(sp.path, db_url=args.db, inventory=inventory, results=args.results,
                                      force=False, console=console, progress_factory=args.progress_factory,
                                      filters=_selection(ls, name), dry=dry, profile_path=ls.profile_path))
            worst = _worse(worst, rc)
    return worst


def _worse(a: int, b: int) -> int:
    """The study's exit code from its plans': a failure (1) or an error (2) outweighs refusals (3)."""
    rank = {0: 0, 3: 1, 1: 2, 2: 3}
    return max(a, b, key=lambda c: rank.get(c, 4))


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    ls = _load(args.study, console)
    if ls is None:
        return 2
    erased = _erased(ls)
    for found in erased.values():
        _say_erased(console, found)
    rc = _each_plan(ls, args, console, dry=False)
    _report(ls, args, console, erased)
    return rc


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    ls = _load(args.study, console)
    if ls is None:
        return 2
    _report(ls, args, console, _erased(ls))
    return 0


def _say_erased(console: Console, erased: list) -> None:
    for e in erased:
        console.print(f"NOT REPRODUCIBLE HERE: {e.comparison}: {e.why}", style="bold red", markup=False)


def _report(ls, args: argparse.Namespace, console: Console, erased: dict[str, list]) -> None:
    from orchestrator.storage.db import open_db
    from orchestrator.study.page import study_results, write_study

    engine = open_db(args.db)
    try:
        results = study_results(ls, engine, erased)
    finally:
        engine.dispose()
    html, csv = write_study(ls, results, Path(args.out))
    summary: dict[str, int] = {}
    for c in results.cells:
        summary[c.verdict] = summary.get(c.verdict, 0) + 1
    console.print(f"study {ls.study.name}: {len(results.cells)} cells: "
                  + ", ".join(f"{n} {v}" for v, n in sorted(summary.items())) + f"\nwrote {html} and {csv}",
                  markup=False)


def add_parser(sub, console: Console, progress_factory) -> None:
    p = sub.add_parser("study", help="replay a published study and set the paper's numbers beside the measured "
                       "ones (docs/studies.md)")
    p.add_argument("action", choices=["list", "dry-run", "run", "report"])
    p.add_argument("study", nargs="?", help="a study's name (experiments/<name>/study.yaml) or its file")
    p.add_argument("--db", default=None, help="database URL (default $TCPLAB_DB or results/tcplab.db)")
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--out", default="results", help="where study-NAME.html and its CSV go")
    p.add_argument("--inventory", type=Path, default=None, help="run on this lab or testbed instead of bringing "
                   "up the lab the study's profile names")
    p.set_defaults(func=lambda args: dispatch(args, console), progress_factory=progress_factory)


def dispatch(args: argparse.Namespace, console: Console) -> int:
    if args.action == "list":
        return cmd_list(console)
    if not args.study:
        console.print(f"tcplab study {args.action} needs a study (`tcplab study list`)", markup=False)
        return 2
    return {"dry-run": cmd_dry_run, "run": cmd_run, "report": cmd_report}[args.action](args, console)
