"""`tcplab run PLAN`: load + expand the plan, put its runs in run order and narrow them to the filters
(engine/selection.py), finish what a previous manager left unfinished (engine/recovery.py), judge every run
not yet complete in the DB on its own (engine/preflight.py): record the refused ones as `refused`, run the
others, show progress, and print a summary line and the results table. `--dry-run`: engine/dry_run.py.

Exit codes (docs/architecture.md, "tcplab run"): 0 every selected run complete; 1 a run failed or was not
stored; 2 the plan (or a filter) is wrong; 3 a run was refused and none failed; 4 an agent unreachable at
start; 5 another manager is running; 6 the database unreachable at start.
"""
from __future__ import annotations

import datetime as dt
import os
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from orchestrator.agent_client import AgentError
from orchestrator.engine import provenance
from orchestrator.engine.arm_identity import erased_by_profile
from orchestrator.engine.dry_run import dry_run
from orchestrator.engine.kernel_builds import attach_builds
from orchestrator.engine.kernel_switch import kernel_groups, switch_hosts
from orchestrator.engine.preflight import REFUSED, Refused, Runnable
from orchestrator.engine.recovery import AnotherManager, recover
from orchestrator.engine.runner import DB_ERRORS, PENDING, RunEngine, RunOutcome
from orchestrator.engine.selection import RunFilter, run_order, select_runs, unknown_filter_values
from orchestrator.engine.topology_match import topology_mismatch
from orchestrator.inventory import load_inventory
from orchestrator.lab.netns import inventory_path
from orchestrator.plan import PlanError, RunSpec, expand, load_plan, plan_sha256
from orchestrator.plan.checks.profile_loader import load_profile
from orchestrator.plan.expansion.adapt import effective_kernels
from orchestrator.storage.db import open_db
from orchestrator.storage.writer import completed_builds


def build_keys(spec) -> dict[str, str | None]:
    """role -> the kernel build key the run expects (None: a distribution or unbuilt kernel, or none asked)."""
    return {role: h.kernel.build_key if h.kernel else None for role, h in spec.hosts.items()}


def exit_code(outcomes: list[RunOutcome]) -> int:
    statuses = {o.status for o in outcomes}
    return 1 if statuses - {"complete", REFUSED} else 3 if REFUSED in statuses else 0


def summary_line(outcomes: list[RunOutcome], skipped: int) -> str:
    n = {status: sum(1 for o in outcomes if o.status == status) for status in ("complete", "failed", REFUSED,
                                                                             PENDING)}
    return (f"{len(outcomes)} runs: {n['complete']} complete, {n['failed']} failed, {n[REFUSED]} refused"
            + (f", {n[PENDING]} not stored" if n[PENDING] else "")
            + (f" ({skipped} already complete, skipped)" if skipped else ""))


async def run_plan(plan_path: Path, db_url: str | None, inventory: Path | None, results: Path,
                   force: bool, console: Console, progress_factory, filters: RunFilter = RunFilter(),
                   dry: bool = False, refresh: bool = False, profile_path: Path | None = None) -> int:
    try:
        profile = load_profile(profile_path) if profile_path is not None else None
        plan = load_plan(plan_path)
    except PlanError as exc:
        console.print(str(exc), markup=False)
        return 2
    kernels = effective_kernels(plan.kernels, profile, plan.source_dir)
    specs, unbuilt = attach_builds(run_order(expand(plan, profile=profile)), kernels, plan_path.parent)
    for name, why in unbuilt.items():
        console.print(f"kernel variant {name}: {why}", style="yellow", markup=False)
    if profile is not None:
        for erased in erased_by_profile(expand(plan), specs):
            console.print(f"NOT REPRODUCIBLE HERE: {erased.why}; profile {profile.name} erases the difference "
                          "between them (each run alone may still run)", style="bold red", markup=False)
    if wrong := unknown_filter_values(specs, filters):
        console.print("\n".join(wrong), style="red", markup=False)
        return 2
    sha = plan_sha256(plan_path)
    plan_row = {"plan_sha256": sha, "name": specs[0].plan_name if specs else plan_path.stem,
                "path": str(plan_path), "text": plan_path.read_text(),
                "created_at": dt.datetime.now(dt.UTC)}
    inv = load_inventory(inventory or inventory_path())
    if profile is not None and profile.testbed.kind != inv.kind:
        console.print(f"cannot start: profile {profile.name} ({profile_path}) is for a {profile.testbed.kind} "
                      f"testbed, the inventory is a {inv.kind} one", style="red", markup=False)
        return 2
    mismatch = topology_mismatch(specs[0].testbed if specs else None, inv, plan_path)
    if mismatch:
        console.print(f"cannot start: {mismatch}", style="red", markup=False)
        return 3
    if dry:
        return await dry_run(select_runs(specs, filters), inv, results, refresh, console)
    try:
        db = open_db(db_url)   # connects and migrates: an unreachable database shows here, before any host
    except DB_ERRORS as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        console.print(f"cannot start: the database is unreachable ({first})", style="red", markup=False)
        return 6
    engine = RunEngine(inv, db, results, provenance=provenance.collect(inv.kind, [plan_row["path"]]))
    try:
        await engine.connect_all()
    except AgentError as exc:
        await engine.close()
        console.print(f"cannot start: {exc}", style="red", markup=False)
        return 4
    async with engine:
        if os.environ.get("TCPLAB_FIXED_MARGINS") != "1":
            await engine.start_ingest_worker()   # imports while recovery and preflight run (engine/pipeline.py)
        try:
            for outcome in await recover(engine):
                console.print(f"recovered run {outcome.run_id}: {outcome.status}"
                              + (f" ({outcome.error})" if outcome.error else ""), markup=False)
        except AnotherManager as exc:
            console.print(f"[red]cannot start: {exc}[/red]", markup=True)
            return 5
        stored = {} if force else completed_builds(db, sha)
        done = {s.run_id for s in specs if stored.get(s.run_id) == build_keys(s)}
        rebuilt = sum(1 for s in specs if s.run_id in stored and s.run_id not in done)
        if rebuilt:
            console.print(f"{rebuilt} runs are complete in the DB on another build of their kernel variant: running "
                          "them again", markup=False)
        in_scope = select_runs(specs, replace(filters, limit=None))
        todo = select_runs([s for s in specs if s.run_id not in done], filters)
        skipped = sum(1 for s in in_scope if s.run_id in done)
        if skipped:
            console.print(f"{skipped} of {len(in_scope)} runs already complete in the DB; skipping them")
        # a UML lab restarts hosts on the kernel each group of runs needs; elsewhere a group is the whole plan
        groups = kernel_groups(todo) if inv.kind == "uml" and todo else [todo]
        verdicts = await _preflight_group(engine, groups[0], inventory or inventory_path(), console)
        outcomes = [await _record_refused(engine, v, plan_row, console) for v in verdicts if isinstance(v, Refused)]
        runnable = [v.spec for v in verdicts if isinstance(v, Runnable)]
        with progress_factory() as progress:
            bar = progress.add_task(plan_path.name, total=len(todo) - len(outcomes), phase="")

            def on_phase(run_id: str, phase: str) -> None:
                progress.update(bar, phase=f"{run_id}: {phase}")

            def on_outcome(outcome: RunOutcome) -> None:
                progress.advance(bar)
                if outcome.status != "complete":
                    what = "not stored" if outcome.status == PENDING else "failed"
                    console.print(f"run {outcome.run_id} {what}: {outcome.error}", style="red", markup=False)
                for flag in outcome.flags:
                    console.print(f"flag {outcome.run_id}: {flag}", style="yellow", markup=False)
                if outcome.timing is not None:
                    console.print(f"run {outcome.run_id}: {outcome.timing.line()}", markup=False)

            engine.on_phase = on_phase
            outcomes += await engine.run_many([(spec, plan_row) for spec in runnable], on_outcome)
            for group in groups[1:]:
                verdicts = await _preflight_group(engine, group, inventory or inventory_path(), console)
                for v in verdicts:
                    if isinstance(v, Refused):
                        outcomes.append(await _record_refused(engine, v, plan_row, console))
                        progress.advance(bar)
                outcomes += await engine.run_many([(v.spec, plan_row) for v in verdicts if isinstance(v, Runnable)],
                                                  on_outcome)
    console.print(summary_line(outcomes, skipped), markup=False)
    ended = {o.run_id for o in outcomes if o.status in ("complete", "failed")}   # refused ones have no data
    shown = [s.run_id for s in in_scope if s.run_id in done or s.run_id in ended]
    from analysis.summary import format_table, run_table

    try:
        if shown:
            print(format_table(run_table(db, shown)))
    except DB_ERRORS as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        console.print(f"no results table: the database is unreachable ({first})", style="red", markup=False)
    return exit_code(outcomes)


async def _preflight_group(engine: RunEngine, group: list[RunSpec], inventory: Path, console: Console) -> list:
    """Preflight verdicts for one kernel group, after a UML lab's hosts were switched to its kernels."""
    if engine.inv.kind == "uml" and group:
        await switch_hosts(engine, group[0], inventory.parent, lambda line: console.print(line, markup=False))
    return engine.preflight(group)


async def _record_refused(engine: RunEngine, refused: Refused, plan_row: dict, console: Console) -> RunOutcome:
    outcome = await engine.record_refused(refused, plan_row)
    console.print(f"run {refused.spec.run_id} {refused.error}" + ("" if outcome.status == REFUSED else
                  f" ({outcome.error})"), style="red", markup=False)
    return outcome

