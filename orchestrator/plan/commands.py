"""`tcplab plan …` commands: validate, expand and table. Output to stdout, problems to stderr.

Each `cmd_*` returns the exit code (0 ok, 2 invalid plan) so the top-level CLI can wire them into its
argparse tree; `main` is a standalone entry point (`python -m orchestrator.plan validate FILE`).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from orchestrator.plan.checks.errors import Issue, PlanError
from orchestrator.plan.checks.loader import load_plan, plan_sha256
from orchestrator.plan.expansion.runs import expand
from orchestrator.plan.expansion.runspec import RunSpec
from orchestrator.plan.expansion.table import render, study_table

EXIT_OK, EXIT_INVALID, EXIT_INTERNAL = 0, 2, 70   # 70: EX_SOFTWARE, a bug in tcplab, not in the plan


def _guarded(path: str | Path, body: Callable[[], None], err: TextIO) -> int:
    """Run a command body; every outcome is located lines, never a traceback (the loader raises only
    PlanError; anything else is a tcplab bug, reported as one line and a distinct exit code)."""
    try:
        body()
    except PlanError as exc:
        for issue in exc.issues:
            print(issue, file=err)
        n = len(exc.issues)
        print(f"{path}: {n} problem{'s' if n != 1 else ''}", file=err)
        return EXIT_INVALID
    except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - the CLI's last line of defence
        print(Issue(str(path), 1, 1, (), f"internal error, please report: {type(exc).__name__}: {exc}"),
              file=err)
        return EXIT_INTERNAL
    return EXIT_OK


def cmd_validate(path: str | Path, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Check a plan; print a one-line summary, or every problem as FILE:LINE:COL: path: message."""
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> None:
        plan = load_plan(path)
        runs = expand(plan)
        cells = len({r.run_id.rsplit("-r", 1)[0] for r in runs})
        print(f"{path}: ok: plan {plan.name}, {len(runs)} runs in {cells} cells, "
              f"sha256 {plan_sha256(path)[:16]}", file=out)
    return _guarded(path, body, err)


def run_summary(run: RunSpec) -> str:
    params = " ".join(f"{k}={v}" for k, v in run.params.items() if not isinstance(v, (dict, list)))
    return f"{run.run_id}  {params}".rstrip()


def cmd_expand(path: str | Path, as_json: bool = False, out: TextIO | None = None,
               err: TextIO | None = None) -> int:
    """Print every run: one summary line each, or (`as_json`) a JSON list of full RunSpecs."""
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> None:
        runs = expand(load_plan(path))
        if as_json:
            json.dump([r.model_dump(mode="json") for r in runs], out, indent=2)
            out.write("\n")
        else:
            for r in runs:
                print(run_summary(r), file=out)
    return _guarded(path, body, err)


def cmd_table(path: str | Path, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the plan as the study's parameter table: rows = parameters (derived included), columns =
    experiments."""
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> None:
        runs = expand(load_plan(path), order="cells")  # the table follows the plan, not the run order
        print(render(*study_table(runs)), file=out)
    return _guarded(path, body, err)


def add_parser(sub: Any) -> None:
    """Add `plan {validate,expand,table}` to an argparse subparsers object (for the top-level CLI)."""
    plan = sub.add_parser("plan", help="check and expand experiment plans")
    cmds = plan.add_subparsers(dest="plan_cmd", required=True)
    cmds.add_parser("validate", help="check a plan; list every problem").add_argument("file")
    ex = cmds.add_parser("expand", help="list the runs of a plan")
    ex.add_argument("file")
    ex.add_argument("--json", action="store_true", help="print full run specs as a JSON list")
    cmds.add_parser("table", help="the study-style table: rows = parameters, columns = experiments"
                     ).add_argument("file")


def dispatch(args: argparse.Namespace) -> int:
    if args.plan_cmd == "validate":
        return cmd_validate(args.file)
    if args.plan_cmd == "expand":
        return cmd_expand(args.file, args.json)
    return cmd_table(args.file)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.plan")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = parser.parse_args(["plan", *(argv if argv is not None else sys.argv[1:])])
    return dispatch(args)
