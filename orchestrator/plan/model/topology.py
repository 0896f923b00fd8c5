"""The testbed's shape as the plan states it (`topology:`), or the default a plan with only `roles` gets.

A topology is hosts (the plan's roles), optional switches (L2 bridges with no agent), and links between
two of them. A host's interface is named after the node it faces (`to-aqm`, `to-switch`); a plan's
`toward: R` names the interface on which host R is directly reachable: the link to R, or the link to a
switch R also hangs off. This module is pure graph data; the checks say what a bad graph is, the labs
turn a graph into namespaces, addresses and routes.

Default rule (a plan without `topology:`), over the roles in the order the plan lists them:
  * two roles: one link between them;
  * a role named `aqm` among three or more: every role listed before it gets its own link to the aqm;
    the roles listed after it get a link each when there is one, and share one switch named `switch`
    (joined to the aqm) when there are several, so the aqm's port to them is one shared bottleneck;
  * no `aqm`: a chain in the listed order.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.names import RoleName

DEFAULT_MIDDLE = "aqm"
DEFAULT_SWITCH = "switch"
MAX_NODE_NAME = 12          # `to-<name>` must fit a Linux interface name (15 characters)

NodePair = Annotated[list[RoleName], Field(min_length=2, max_length=2)]


class TopologySection(Strict):
    """The `topology:` section: which hosts are linked, and which nodes are switches."""

    links: list[NodePair] = _f(..., "links as pairs of nodes (roles or switches); one subnet per link, or per "
                               "switch for every host linked to it", [["sender", "aqm"], ["aqm", "receiver"]],
                               min_length=1)
    switches: list[RoleName] = _f([], "nodes that are L2 switches (no agent, no address): every host linked to "
                                  "one shares a subnet and reaches the others directly", ["switch"])


@dataclass(frozen=True)
class Graph:
    """Hosts in plan order, switches, and links (pairs of node names) in the order written."""

    hosts: tuple[str, ...]
    switches: tuple[str, ...]
    links: tuple[tuple[str, str], ...]

    def linked(self, node: str) -> list[str]:
        """Nodes `node` has a link to, in link order (one interface each)."""
        return [b if a == node else a for a, b in self.links if node in (a, b)]

    def reachable(self, host: str, node: str) -> list[str]:
        """Hosts directly reachable on `host`'s interface toward `node` (a host, or every host on a switch)."""
        if node not in self.switches:
            return [node]
        return [h for h in self.linked(node) if h != host and h in self.hosts]

    def neighbours(self, host: str) -> dict[str, list[str]]:
        """Interface node -> the hosts reachable on it, for every interface of `host`."""
        return {node: self.reachable(host, node) for node in self.linked(host)}

    def interface_toward(self, host: str, role: str) -> str | None:
        """The node whose interface `toward: role` names on `host`, or None if role is not a neighbour."""
        return next((node for node, hosts in self.neighbours(host).items() if role in hosts), None)

    def components(self) -> list[list[str]]:
        """Connected groups of nodes (a single group when every host can reach every other)."""
        nodes = list(self.hosts) + list(self.switches)
        seen: set[str] = set()
        out = []
        for start in nodes:
            if start in seen:
                continue
            group, todo = [], deque([start])
            seen.add(start)
            while todo:
                n = todo.popleft()
                group.append(n)
                for m in self.linked(n):
                    if m not in seen and m in nodes:
                        seen.add(m)
                        todo.append(m)
            out.append(group)
        return out


def default_links(roles: list[str]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(links, switches) of a plan that states only its roles (the rule in the module docstring)."""
    if len(roles) == 2 or DEFAULT_MIDDLE not in roles:
        return tuple(zip(roles, roles[1:], strict=False)), ()
    i = roles.index(DEFAULT_MIDDLE)
    before, after = roles[:i], roles[i + 1:]
    links = [(r, DEFAULT_MIDDLE) for r in before]
    if len(after) <= 1:
        return tuple(links + [(DEFAULT_MIDDLE, r) for r in after]), ()
    return (tuple(links + [(DEFAULT_MIDDLE, DEFAULT_SWITCH)] + [(DEFAULT_SWITCH, r) for r in after]),
            (DEFAULT_SWITCH,))


def plan_graph(roles: list[str], section: TopologySection | None) -> Graph:
    """The plan's topology: as stated, or the default for its roles."""
    if section is None:
        links, switches = default_links(roles)
        return Graph(tuple(roles), switches, links)
    return Graph(tuple(roles), tuple(section.switches), tuple((a, b) for a, b in section.links))
