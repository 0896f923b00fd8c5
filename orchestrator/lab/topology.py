"""The netns lab's topology as data (pure): namespaces, veth links, addresses, routes, neighbours.

client <-> aqm <-> server; interfaces are named after the peer they face (`to-aqm`, `to-client`, ...),
which is exactly how plans refer to them (`toward`). Addresses live only inside the namespaces.
"""
from __future__ import annotations

from dataclasses import dataclass

PREFIX = "tcplab"
ROLES = ("client", "aqm", "server")


@dataclass(frozen=True)
class Endpoint:
    role: str
    ifname: str
    addr: str
    plen: int


@dataclass(frozen=True)
class Link:
    a: Endpoint
    b: Endpoint
    subnet: str


@dataclass(frozen=True)
class Topology:
    prefix: str
    links: tuple[Link, ...]

    def namespace(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    @property
    def roles(self) -> tuple[str, ...]:
        return ROLES

    def endpoints(self, role: str) -> list[Endpoint]:
        return [e for link in self.links for e in (link.a, link.b) if e.role == role]

    def peer(self, ep: Endpoint) -> Endpoint:
        for link in self.links:
            if ep == link.a:
                return link.b
            if ep == link.b:
                return link.a
        raise KeyError(ep)


def netns_topology(prefix: str = PREFIX, net: str = "10.199") -> Topology:
    return Topology(prefix=prefix, links=(
        Link(Endpoint("client", "to-aqm", f"{net}.1.1", 24), Endpoint("aqm", "to-client", f"{net}.1.254", 24),
             f"{net}.1.0/24"),
        Link(Endpoint("server", "to-aqm", f"{net}.2.1", 24), Endpoint("aqm", "to-server", f"{net}.2.254", 24),
             f"{net}.2.0/24"),
    ))


def namespace_argv(topo: Topology, roles: tuple[str, ...] | None = None) -> list[list[str]]:
    """Create the namespaces of `roles` (default: all) with loopback up."""
    roles = topo.roles if roles is None else roles
    return ([["ip", "netns", "add", topo.namespace(r)] for r in roles]
            + [["ip", "-n", topo.namespace(r), "link", "set", "lo", "up"] for r in roles])


def address_argv(topo: Topology, ep: Endpoint) -> list[list[str]]:
    ns = topo.namespace(ep.role)
    return [["ip", "-n", ns, "addr", "add", f"{ep.addr}/{ep.plen}", "dev", ep.ifname],
            ["ip", "-n", ns, "link", "set", ep.ifname, "up"]]


def routes(topo: Topology) -> list[tuple[str, str, str, str]]:
    """(role, subnet, via, dev): endpoints reach the far subnet through the aqm; no default route, so
    nothing leaves the lab."""
    out = []
    for link in topo.links:
        end = link.a if link.a.role != "aqm" else link.b
        router = topo.peer(end)
        out += [(end.role, other.subnet, router.addr, end.ifname) for other in topo.links if other is not link]
    return out


def route_argv(topo: Topology, roles: tuple[str, ...] | None = None) -> list[list[str]]:
    return [["ip", "-n", topo.namespace(role), "route", "add", subnet, "via", via, "dev", dev]
            for role, subnet, via, dev in routes(topo) if roles is None or role in roles]


def build_argv(topo: Topology) -> list[list[str]]:
    """Every command that builds the lab, in order (neighbour entries need MACs: see neigh_argv)."""
    cmds = namespace_argv(topo)
    for link in topo.links:
        a, b = link.a, link.b
        cmds.append(["ip", "link", "add", a.ifname, "netns", topo.namespace(a.role), "type", "veth",
                     "peer", "name", b.ifname, "netns", topo.namespace(b.role)])
        cmds += address_argv(topo, a) + address_argv(topo, b)
    cmds.append(["ip", "netns", "exec", topo.namespace("aqm"), "sysctl", "-qw", "net.ipv4.ip_forward=1"])
    return cmds + route_argv(topo)


def neigh_argv(topo: Topology, macs: dict[tuple[str, str], str],
               roles: tuple[str, ...] | None = None) -> list[list[str]]:
    """Static neighbour entries for every data-path peer (G-ARP); macs[(role, ifname)] -> lladdr.
    `roles` limits the entries to those namespaces (the VM lab's aqm configures its own)."""
    cmds = []
    for link in topo.links:
        for ep in (link.a, link.b):
            if roles is not None and ep.role not in roles:
                continue
            peer = topo.peer(ep)
            cmds.append(["ip", "-n", topo.namespace(ep.role), "neigh", "replace", peer.addr, "lladdr",
                         macs[(peer.role, peer.ifname)], "dev", ep.ifname, "nud", "permanent"])
    return cmds
