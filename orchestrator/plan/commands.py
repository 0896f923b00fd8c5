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
from orchestrator.plan.checks.profile_loader import load_profile
from orchestrator.plan.expansion.runs import expand
from orchestrator.plan.expansion.runspec import RunSpec
from orchestrator.plan.expansion.table import render, study_table
from orchestrator.plan.model.profile import Profile

EXIT_OK, EXIT_INVALID, EXIT_INTERNAL = 0, 2, 70   # 70: EX_SOFTWARE, a bug in tcplab, not in the plan
PROFILE_HELP = "a testbed profile (experiments/profiles/) adapting the plan's kernels, rates and captures"


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


def _profile(profile: str | Path | None) -> Profile | None:
    return load_profile(profile) if profile is not None else None


def cmd_validate(path: str | Path, out: TextIO | None = None, err: TextIO | None = None,
                 profile: str | Path | None = None) -> int:
    """Check a plan (and a profile); print a one-line summary, or every problem as FILE:LINE:COL: path: message."""
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> None:
        prof = _profile(profile)
        plan = load_plan(path)
        runs = expand(plan, profile=prof)
        cells = len({r.run_id.rsplit("-r", 1)[0] for r in runs})
        adapted = f", adapted by profile {prof.name} (rates {rate_factors(runs)})" if prof and runs \
            and runs[0].profile else ""
        print(f"{path}: ok: plan {plan.name}, {len(runs)} runs in {cells} cells, "
              f"sha256 {plan_sha256(path)[:16]}{adapted}", file=out)
    return _guarded(profile or path, body, err)


def rate_factors(runs: list[RunSpec]) -> str:
    """`x0.05`, or per experiment when they differ: `x0.05 (1, 2), x0.005 (tb-e16)`."""
    by_factor: dict[float, list[str]] = {}
    for r in runs:
        if r.profile is not None and r.experiment not in by_factor.setdefault(r.profile.scale_factor, []):
            by_factor[r.profile.scale_factor].append(r.experiment)
    if len(by_factor) == 1:
        return f"x{next(iter(by_factor)):.6g}"
    return ", ".join(f"x{f:.6g} ({', '.join(es)})" for f, es in sorted(by_factor.items(), reverse=True))


def run_summary(run: RunSpec) -> str:
    params = " ".join(f"{k}={v}" for k, v in run.params.items() if not isinstance(v, (dict, list)))
    return f"{run.run_id}  {params}".rstrip()


def substitution_lines(runs: list[RunSpec]) -> list[str]:
    """A profile's changes, for `plan expand`: the kernel substitutions once (they are the plan's), then the
    changes of each run under its summary line (adapted_summary)."""
    if not runs or runs[0].profile is None:
        return []
    p = runs[0].profile
    kernels = {s.field: s for r in runs for s in r.substitutions if s.kind == "kernel"}
    lines = [f"# profile {p.name} (sha256 {p.sha256}): rates {rate_factors(runs)}"]
    lines += [f"# {s.field}: {s.was} -> {s.now}" + (f" ({s.why})" if s.why else "") for s in kernels.values()]
    return lines


def adapted_summary(run: RunSpec) -> str:
    """The run's summary line, and its own substitutions (rates, times, captures) as `field was->now`."""
    own = [f"{s.field} {s.was}->{s.now}" for s in run.substitutions if s.kind != "kernel" and s.was != s.now]
    return run_summary(run) + ("\n    " + ", ".join(own) if own else "")


def cmd_expand(path: str | Path, as_json: bool = False, out: TextIO | None = None,
               err: TextIO | None = None, profile: str | Path | None = None) -> int:
    """Print every run: one summary line each (with a profile: the substitutions it made), or (`as_json`) a
    JSON list of full RunSpecs."""
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> None:
        runs = expand(load_plan(path), profile=_profile(profile))
        if as_json:
            json.dump([r.model_dump(mode="json") for r in runs], out, indent=2)
            out.write("\n")
        else:
            for line in substitution_lines(runs):
                print(line, file=out)
            for r in runs:
                print(adapted_summary(r), file=out)
    return _guarded(profile or path, body, err)


def cmd_table(path: str | Path, out: TextIO | None = None, err: TextIO | None = None,
              profile: str | Path | None = None) -> int:
    """Print the plan as the study's parameter table: rows = parameters (derived included, with a profile the
    adapted run's), columns = experiments."""
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> None:
        # the table follows the plan, not the run order
        runs = expand(load_plan(path), order="cells", profile=_profile(profile))
        print(render(*study_table(runs)), file=out)
    return _guarded(path, body, err)


def add_parser(sub: Any) -> None:
    """Add `plan {validate,expand,table}` to an argparse subparsers object (for the top-level CLI)."""
    plan = sub.add_parser("plan", help="check and expand experiment plans")
    cmds = plan.add_subparsers(dest="plan_cmd", required=True)
    va = cmds.add_parser("validate", help="check a plan; list every problem")
    ex = cmds.add_parser("expand", help="list the runs of a plan")
    ex.add_argument("--json", action="store_true", help="print full run specs as a JSON list")
    ta = cmds.add_parser("table", help="the study-style table: rows = parameters, columns = experiments")
    for p in (va, ex, ta):
        p.add_argument("file")
        p.add_argument("--profile", default=None, help=PROFILE_HELP)


def dispatch(args: argparse.Namespace) -> int:
    if args.plan_cmd == "validate":
        return cmd_validate(args.file, profile=args.profile)
    if args.plan_cmd == "expand":
        return cmd_expand(args.file, args.json, profile=args.profile)
    return cmd_table(args.file, profile=args.profile)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.plan")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = parser.parse_args(["plan", *(argv if argv is not None else sys.argv[1:])])
    return dispatch(args)
