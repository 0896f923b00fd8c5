"""Does the testbed fit the plan's topology? (pure) `tcplab run` asks before it connects to any agent, so a
lab built for another plan is refused with what it has, what the plan needs, and the command that fixes it."""
from __future__ import annotations

from pathlib import Path

from orchestrator.inventory import LAB_KINDS, Inventory
from orchestrator.plan import TopologySpec


def _edges(links: list) -> set[frozenset[str]]:
    return {frozenset(pair) for pair in links}


def topology_mismatch(need: TopologySpec | None, inv: Inventory, plan_path: Path) -> str | None:
    """None when the inventory has every host the plan needs and, for a lab that recorded its topology, the
    same links; otherwise one sentence saying so and how to fix it."""
    if need is None:
        return None
    fix = (f"run `tcplab lab up --plan {plan_path}`" if inv.kind in LAB_KINDS
           else "give the inventory a host for each role, with interfaces toward its neighbours")
    have = list(inv.hosts)
    if not set(need.hosts) <= set(have):
        return (f"the testbed has hosts {', '.join(have)}; the plan needs {', '.join(need.hosts)}: {fix}")
    built = inv.topology
    if built is not None and (_edges(built.get("links", [])) != _edges(need.links)
                              or sorted(built.get("switches", [])) != sorted(need.switches)):
        links = lambda ls: ", ".join("-".join(p) for p in ls)  # noqa: E731 - local formatter
        return (f"the lab is built as {links(built.get('links', []))}; the plan needs {links(need.links)}: {fix}")
    return None
