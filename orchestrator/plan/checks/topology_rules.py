"""Rules of the plan's topology (model/topology.py): the graph itself, and every `toward` of a run.

`graph_problems` checks the stated (or default) graph once per plan; `link_problems` checks that each
interface a run names (`host` + `toward`) exists in that graph: `toward` must be a host directly reachable
from `host`, over a link or through a switch. Both return `Problem`s at the field to change.
"""
from __future__ import annotations

from orchestrator.plan.checks.errors import Problem
from orchestrator.plan.model.paths import KeyPath
from orchestrator.plan.model.plan import Plan
from orchestrator.plan.model.template import RunTemplate
from orchestrator.plan.model.topology import MAX_NODE_NAME, Graph, plan_graph


def _where(plan: Plan) -> KeyPath:
    return ("topology",) if plan.topology is not None else ("roles",)


def _link_problems_of_graph(g: Graph, stated: bool) -> list[Problem]:
    out: list[Problem] = []
    nodes = set(g.hosts) | set(g.switches)
    seen: dict[frozenset[str], int] = {}
    for i, (a, b) in enumerate(g.links):
        path: KeyPath = ("topology", "links", i) if stated else ("roles",)
        for k, node in enumerate((a, b)):
            if node not in nodes:
                out.append(Problem(path + (k,), f"unknown host {node!r} (roles: {', '.join(g.hosts)}; switches: "
                                   f"{', '.join(g.switches) or 'none'})"))
        if a == b:
            out.append(Problem(path, f"a link joins two different nodes, not {a!r} to itself"))
        elif a in g.switches and b in g.switches:
            out.append(Problem(path, "a link between two switches: link hosts to one switch instead"))
        key = frozenset((a, b))
        if key in seen and a != b:
            out.append(Problem(path, f"same link as topology.links[{seen[key]}]"))
        seen.setdefault(key, i)
    return out


def graph_problems(plan: Plan) -> list[Problem]:
    """The topology is a graph over the plan's roles (and its switches) that joins every host."""
    g = plan_graph(plan.roles, plan.topology)
    stated = plan.topology is not None
    out: list[Problem] = []
    for k, sw in enumerate(g.switches):
        if sw in g.hosts:
            out.append(Problem(("topology", "switches", k) if stated else _where(plan),
                               f"{sw!r} is a role: a switch is a node with no agent"
                               + ("" if stated else " (the default topology names its switch so; state `topology:`)")))
    if out:
        return out       # the links of a node that is both would only repeat the problem
    out += _link_problems_of_graph(g, stated)
    for node in list(g.hosts) + list(g.switches):
        if len(node) > MAX_NODE_NAME and g.linked(node):
            out.append(Problem(_where(plan), f"{node!r} is longer than {MAX_NODE_NAME} characters: the interfaces "
                               f"facing it, `to-{node}`, would not fit a Linux interface name"))
    if out:
        return out
    for h in g.hosts:
        if not g.linked(h):
            out.append(Problem(_where(plan), f"host {h!r} has no link"))
    groups = g.components()
    if not out and len(groups) > 1:
        parts = "; ".join(", ".join(grp) for grp in groups)
        out.append(Problem(_where(plan), f"the topology is not connected: {parts} cannot reach each other"))
    for sw in g.switches:
        if len([n for n in g.linked(sw) if n in g.hosts]) < 2:
            out.append(Problem(_where(plan), f"switch {sw!r} joins fewer than two hosts"))
    return out


def _not_neighbour(g: Graph, host: str, toward: str) -> str | None:
    if host not in g.hosts or toward not in g.hosts or host == toward:
        return None            # run_rules reports unknown roles and an interface facing its own host
    if g.interface_toward(host, toward) is not None:
        return None
    near = sorted({h for hosts in g.neighbours(host).values() for h in hosts})
    return f"{toward!r} is not a neighbour of {host!r} in the topology (neighbours: {', '.join(near) or 'none'})"


def link_problems(run: RunTemplate, g: Graph) -> list[Problem]:
    """Every (host, toward) of one run names an interface of the topology; two qdisc chains of one host
    never land on the same interface (two roles behind one switch share it)."""
    refs: list[tuple[str, str, KeyPath]] = []
    if run.bottleneck is not None:
        refs.append((run.bottleneck.at.host, run.bottleneck.at.toward, ("bottleneck", "at", "toward")))
    refs += [(c.host, c.toward, ("captures", i, "toward")) for i, c in enumerate(run.captures or [])]
    if run.qdisc_stats is not None:
        refs += [(ln.host, ln.toward, ("qdisc_stats", "links", i, "toward"))
                 for i, ln in enumerate(run.qdisc_stats.links)]
    refs += [(e.host, e.toward, ("events", i, "toward")) for i, e in enumerate(run.events)
             if e.toward is not None]
    out = [Problem(path, msg) for host, toward, path in refs if (msg := _not_neighbour(g, host, toward))]
    for role, section in run.hosts.items():
        chains: dict[str, str] = {}
        if run.bottleneck is not None and run.bottleneck.at.host == role:
            chains[g.interface_toward(role, run.bottleneck.at.toward) or ""] = "bottleneck.at"
        for toward in section.qdiscs:
            path: KeyPath = ("hosts", role, "qdiscs", toward)
            if role not in g.hosts:
                continue
            msg = _not_neighbour(g, role, toward)
            if msg:
                out.append(Problem(path, msg, at_key=True))
                continue
            node = g.interface_toward(role, toward)
            if node is not None and node in chains and node in g.switches:
                out.append(Problem(path, f"same interface (to-{node}) as {chains[node]}: {toward!r} is reached "
                                   f"through switch {node!r}", at_key=True))
            if node is not None:
                chains.setdefault(node, f"hosts.{role}.qdiscs.{toward}")
    return out
