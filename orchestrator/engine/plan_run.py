"""`tcplab run PLAN`: load + expand the plan, refuse what the hosts cannot do, run what is not yet
complete in the DB, show progress, and print the results table of the plan's runs."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from rich.console import Console

from orchestrator.engine.runner import PreflightRefused, RunEngine
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
    db = open_db(db_url)
    done = set() if force else completed_run_ids(db, sha)
    todo = [s for s in specs if s.run_id not in done]
    if done:
        console.print(f"{len(specs) - len(todo)} of {len(specs)} runs already complete in the DB; skipping them")
    failed = 0
    async with RunEngine(inv, db, results) as engine:
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
                    console.print(f"[red]run {spec.run_id} failed[/red]: {outcome.error}", markup=True)
                for flag in outcome.flags:
                    console.print(f"flag {spec.run_id}: {flag}", style="yellow", markup=False)
    from analysis.summary import format_table, run_table

    print(format_table(run_table(db, [s.run_id for s in specs])))
    return 1 if failed else 0
