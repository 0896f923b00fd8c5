"""`tcplab run PLAN --dry-run`: every selected run judged by the per-run preflight (engine/preflight.py) and
shown as runnable or refused with the reasons, touching no host and no database.

The capabilities come from the cache of the last hellos (engine/capcache.py) when it is fresh for every
inventory host; otherwise the agents are connected for their hello only (nothing applied, nothing reset) and
the cache is refreshed.
"""
from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchestrator.agent_client import AgentError
from orchestrator.engine import capcache
from orchestrator.engine.kernel_switch import as_switched
from orchestrator.engine.preflight import Refused, Verdict, check_runs
from orchestrator.engine.runner import RunEngine
from orchestrator.engine.selection import arm_of, kernel_label
from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from schemas import protocol

MAX_PARAMS_SHOWN = 4    # the table stays readable; `tcplab plan table` shows every value


def _value(v: object) -> str:
    """A param value as short as it reads: a queue `{kind: pfifo, limit: 100}` as `pfifo(limit=100)`."""
    if isinstance(v, dict):
        rest = ",".join(f"{k}={x}" for k, x in v.items() if k != "kind")
        return f"{v.get('kind', '')}({rest})" if "kind" in v else "{" + rest + "}"
    return str(v)


def cell_label(spec: RunSpec) -> str:
    """The values that define the run's cell, arm first, as `name=value`."""
    items = [(k, v) for k, v in spec.params.items() if k != "arm"]
    shown = [f"{k}={_value(v)}" for k, v in items[:MAX_PARAMS_SHOWN]]
    if len(items) > MAX_PARAMS_SHOWN:
        shown.append(f"(+{len(items) - MAX_PARAMS_SHOWN})")
    return " ".join(([f"arm={arm_of(spec)}"] if arm_of(spec) else []) + shown) or "-"


def verdict_table(verdicts: list[Verdict], caption: str) -> Table:
    table = Table(title="preflight per run", caption=caption, show_lines=False)
    for name in ("run", "experiment", "arm / cell", "rep", "kernel", "verdict"):
        table.add_column(name, overflow="fold")
    for v in verdicts:
        s = v.spec
        verdict = ("[red]refused[/red]: " + "; ".join(v.reasons)) if isinstance(v, Refused) else "[green]runnable"
        table.add_row(s.run_id, s.experiment, cell_label(s), str(s.repetition), kernel_label(s), verdict)
    return table


def count_line(verdicts: list[Verdict]) -> str:
    n = Counter("refused" if isinstance(v, Refused) else "runnable" for v in verdicts)
    return f"{len(verdicts)} runs: {n['runnable']} runnable, {n['refused']} refused"


async def live_capabilities(inv: Inventory, results: Path) -> dict[str, protocol.Capabilities]:
    """Hello to every inventory host (and nothing else), each hello written to the cache."""
    engine = RunEngine(inv, None, results)   # type: ignore[arg-type]  # hello only: no database is used
    try:
        await engine.connect_all()
        return engine.caps
    finally:
        await engine.close()


def judge(specs: list[RunSpec], caps: dict[str, protocol.Capabilities], inv: Inventory) -> tuple[list[Verdict], int]:
    """Every run's preflight verdict, and how many runnable ones need a kernel switch first. On a UML lab a host
    whose run needs another cached build is restarted on it before the run (engine/kernel_switch.py): judged
    with that build's release, the rest of its hello as it is now."""
    if inv.kind != "uml":
        return check_runs(specs, caps, inv), 0
    verdicts, switched = [], 0
    for spec in specs:
        judged = as_switched(spec, caps)
        (v,) = check_runs([spec], judged, inv)
        verdicts.append(v)
        switched += not isinstance(v, Refused) and judged != caps   # a host reports another release: a switch
    return verdicts, switched


async def dry_run(specs: list[RunSpec], inv: Inventory, results: Path, refresh: bool, console: Console) -> int:
    """Print the verdict of every run; 0 all runnable, 3 some refused, 4 an agent unreachable (stale cache)."""
    entries = capcache.load(results)
    stale = ["--refresh"] if refresh else capcache.stale_hosts(entries, inv, dt.datetime.now(dt.UTC))
    if stale:
        console.print(f"capability cache {capcache.cache_path(results)} not used ({'; '.join(stale)}): asking "
                      "the agents (hello only)", markup=False)
        try:
            caps = await live_capabilities(inv, results)
        except AgentError as exc:
            console.print(f"cannot preflight: {exc}", style="red", markup=False)
            return 4
        source = "capabilities from the agents' hello just now"
    else:
        caps = {role: e.capabilities for role, e in entries.items() if role in inv.hosts}
        oldest = min(entries[role].at for role in inv.hosts)
        source = (f"capabilities cached at the last hello ({capcache.cache_path(results)}, oldest "
                  f"{oldest:%Y-%m-%d %H:%M:%S} UTC); no agent contacted")
    verdicts, switched = judge(specs, caps, inv)
    console.print(verdict_table(verdicts, source))
    note = (f"; {switched} of them after a restart of hosts on a kernel build, judged by what the running kernel "
            "can do" if switched else "")
    console.print(count_line(verdicts) + f" (dry run: no host and no database touched{note})", markup=False)
    return 3 if any(isinstance(v, Refused) for v in verdicts) else 0
