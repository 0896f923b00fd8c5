"""`tcplab run PLAN`: load + expand the plan, finish what a previous manager left unfinished (engine/recovery.py),
refuse what the hosts cannot do, run what is not yet complete in the DB, show progress, and print the results
table of the plan's runs."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from rich.console import Console

from orchestrator.agent_client import AgentError
from orchestrator.engine.recovery import AnotherManager, recover
from orchestrator.engine.runner import DB_ERRORS, PENDING, PreflightRefused, RunEngine
from orchestrator.engine.topology_match import topology_mismatch
from orchestrator.inventory import load_inventory
from orchestrator.lab.netns import inventory_path
from orchestrator.plan import PlanError, expand, load_plan, plan_sha256
from orchestrator.storage.db import open_db
from orchestrator.storage.writer import completed_run_ids


async def run_plan(plan_path: Path, db_url: str | None, inventory: Path | None, results: Path,
                   force: bool, console: Console, progress_factory) -> int:
    try:
        plan = load_plan(plan_path)
    except PlanError as exc:
        console.print(str(exc), markup=False)
        return 2
    specs = expand(plan)
    sha = plan_sha256(plan_path)
    plan_row = {"plan_sha256": sha, "name": specs[0].plan_name if specs else plan_path.stem,
                "path": str(plan_path), "text": plan_path.read_text(),
                "created_at": dt.datetime.now(dt.UTC)}
    inv = load_inventory(inventory or inventory_path())
    mismatch = topology_mismatch(specs[0].testbed if specs else None, inv, plan_path)
    if mismatch:
        console.print(f"cannot start: {mismatch}", style="red", markup=False)
        return 3
    try:
        db = open_db(db_url)   # connects and migrates: an unreachable database shows here, before any host
    except DB_ERRORS as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        console.print(f"cannot start: the database is unreachable ({first})", style="red", markup=False)
        return 6
    failed = 0
    engine = RunEngine(inv, db, results)
    try:
        await engine.connect_all()
    except AgentError as exc:
        await engine.close()
        console.print(f"cannot start: {exc}", style="red", markup=False)
        return 4
    async with engine:
        try:
            for outcome in await recover(engine):
                console.print(f"recovered run {outcome.run_id}: {outcome.status}"
                              + (f" ({outcome.error})" if outcome.error else ""), markup=False)
        except AnotherManager as exc:
            console.print(f"[red]cannot start: {exc}[/red]", markup=True)
            return 5
        done = set() if force else completed_run_ids(db, sha)
        todo = [s for s in specs if s.run_id not in done]
        if done:
            console.print(f"{len(specs) - len(todo)} of {len(specs)} runs already complete in the DB; skipping them")
        try:
            engine.preflight(todo)
        except PreflightRefused as exc:
            console.print(f"[red]{exc}[/red]", markup=True)
            return 3
        with progress_factory() as progress:
            bar = progress.add_task(plan_path.name, total=len(todo), phase="")

            def on_phase(run_id: str, phase: str) -> None:
                progress.update(bar, phase=f"{run_id}: {phase}")

            engine.on_phase = on_phase
            for spec in todo:
                outcome = await engine.run_one(spec, plan_row)
                progress.advance(bar)
                if outcome.status != "complete":
                    failed += 1
                    what = "not stored" if outcome.status == PENDING else "failed"
                    console.print(f"run {spec.run_id} {what}: {outcome.error}", style="red", markup=False)
                for flag in outcome.flags:
                    console.print(f"flag {spec.run_id}: {flag}", style="yellow", markup=False)
    from analysis.summary import format_table, run_table

    try:
        print(format_table(run_table(db, [s.run_id for s in specs])))
    except DB_ERRORS as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        console.print(f"no results table: the database is unreachable ({first})", style="red", markup=False)
    return 1 if failed else 0

