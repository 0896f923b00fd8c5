"""A lab's topology as data (pure): namespaces, veth links, bridges, addresses, routes, neighbours.

Built from the plan's graph (orchestrator/plan/model/topology.py): one namespace per host and per switch,
one veth pair per link; a switch is a bridge (`br0`) in its own namespace. Interfaces are named after the
node they face (`to-aqm`, `to-switch`), which is how plans refer to them (`toward`). Addresses live only
inside the namespaces, one /24 per segment (a point-to-point link, or a switch and every host on it),
numbered in link order: `<net>.<segment>.0/24`. On each segment, hosts that forward (more than one link)
take addresses from the top (.254, .253, ...), the others from the bottom (.1, .2, ...), in role order:
the quickstart's chain keeps client 10.199.1.1, aqm 10.199.1.254 / 10.199.2.254, server 10.199.2.1.
Routes: every host reaches every subnet through the next hop of a breadth-first search; no default route,
so nothing leaves the lab.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from orchestrator.plan.model.topology import Graph, default_links

PREFIX = "tcplab"
ROLES = ("client", "aqm", "server")       # the quickstart's lab, `tcplab lab up` without a plan
BRIDGE = "br0"
MAX_SEGMENTS = 254


@dataclass(frozen=True)
class Endpoint:
    role: str          # a host, or a switch (then addr is "" and plen 0: a bridge port)
    ifname: str
    addr: str
    plen: int


@dataclass(frozen=True)
class Link:
    a: Endpoint
    b: Endpoint        # on a host's link to a switch, the switch's port
    subnet: str


@dataclass(frozen=True)
class Topology:
    prefix: str
    links: tuple[Link, ...]
    hosts: tuple[str, ...] = ROLES
    switches: tuple[str, ...] = ()

    def namespace(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    @property
    def roles(self) -> tuple[str, ...]:
        return self.hosts

    def endpoints(self, role: str) -> list[Endpoint]:
        return [e for link in self.links for e in (link.a, link.b) if e.role == role]

    def peer(self, ep: Endpoint) -> Endpoint:
        for link in self.links:
            if ep == link.a:
                return link.b
            if ep == link.b:
                return link.a
        raise KeyError(ep)

    def segment_peers(self, ep: Endpoint) -> list[Endpoint]:
        """The other hosts' endpoints on `ep`'s subnet: its link's peer, or every host on the same switch."""
        subnet = next(link.subnet for link in self.links if ep in (link.a, link.b))
        return [e for link in self.links if link.subnet == subnet for e in (link.a, link.b)
                if e != ep and e.role in self.hosts]

    def routers(self) -> tuple[str, ...]:
        return tuple(h for h in self.hosts if len(self.endpoints(h)) > 1)


def _segments(g: Graph) -> list[tuple[tuple[str, str], int]]:
    """Each link with its segment number (1-based): a link of its own, or the segment of its switch."""
    of_switch: dict[str, int] = {}
    out, n = [], 0
    for a, b in g.links:
        sw = a if a in g.switches else b if b in g.switches else None
        if sw is None or sw not in of_switch:
            n += 1
            if sw is not None:
                of_switch[sw] = n
        out.append(((a, b), of_switch[sw] if sw else n))
    if n > MAX_SEGMENTS:
        raise ValueError(f"the topology has {n} segments; the lab numbers at most {MAX_SEGMENTS}")
    return out


def _host_addresses(g: Graph, segments: list[tuple[tuple[str, str], int]]) -> dict[tuple[str, int], int]:
    """(host, segment) -> last octet: forwarding hosts from .254 down, the others from .1 up, in role order."""
    members: dict[int, list[str]] = {}
    for (a, b), seg in segments:
        for h in (a, b):
            if h in g.hosts and h not in members.setdefault(seg, []):
                members[seg].append(h)
    out = {}
    for seg, hosts in members.items():
        ordered = sorted(hosts, key=g.hosts.index)
        routers = [h for h in ordered if len(g.linked(h)) > 1]
        leaves = [h for h in ordered if h not in routers]
        out.update({(h, seg): 254 - i for i, h in enumerate(routers)})
        out.update({(h, seg): 1 + i for i, h in enumerate(leaves)})
    return out


def lab_topology(g: Graph, prefix: str = PREFIX, net: str = "10.199") -> Topology:
    """The lab that builds graph `g` (a checked plan's graph: connected, known nodes, no self-links)."""
    segments = _segments(g)
    octet = _host_addresses(g, segments)
    links = []
    for (a, b), seg in segments:
        if a in g.switches or (b in g.hosts and len(g.linked(a)) > 1 and len(g.linked(b)) == 1):
            a, b = b, a        # the host (or the leaf of a router-leaf pair) first, as `ip link add` names it

        def end(node: str, other: str, seg: int = seg) -> Endpoint:
            if node in g.switches:
                return Endpoint(node, f"to-{other}", "", 0)
            return Endpoint(node, f"to-{other}", f"{net}.{seg}.{octet[(node, seg)]}", 24)

        links.append(Link(end(a, b), end(b, a), f"{net}.{seg}.0/24"))
    return Topology(prefix=prefix, links=tuple(links), hosts=g.hosts, switches=g.switches)


def netns_topology(prefix: str = PREFIX, net: str = "10.199") -> Topology:
    """The quickstart's lab: client <-> aqm <-> server."""
    links, switches = default_links(list(ROLES))
    return lab_topology(Graph(ROLES, switches, links), prefix, net)


def namespace_argv(topo: Topology, roles: tuple[str, ...] | None = None) -> list[list[str]]:
    """Create the namespaces of `roles` (default: every host and switch) with loopback up."""
    roles = topo.hosts + topo.switches if roles is None else roles
    return ([["ip", "netns", "add", topo.namespace(r)] for r in roles]
            + [["ip", "-n", topo.namespace(r), "link", "set", "lo", "up"] for r in roles])


def address_argv(topo: Topology, ep: Endpoint) -> list[list[str]]:
    ns = topo.namespace(ep.role)
    if ep.role in topo.switches:     # a bridge port: no address
        return [["ip", "-n", ns, "link", "set", ep.ifname, "master", BRIDGE],
                ["ip", "-n", ns, "link", "set", ep.ifname, "up"]]
    return [["ip", "-n", ns, "addr", "add", f"{ep.addr}/{ep.plen}", "dev", ep.ifname],
            ["ip", "-n", ns, "link", "set", ep.ifname, "up"]]


def _next_hops(topo: Topology, host: str) -> dict[str, Endpoint]:
    """Breadth-first from `host` over shared subnets: for every host reached, the first hop's endpoint
    on the subnet it shares with `host` (ties go to the first link in order), in breadth-first order."""
    first: dict[str, Endpoint] = {}
    todo: deque[str] = deque()
    for ep in topo.endpoints(host):
        for peer in topo.segment_peers(ep):
            if peer.role not in first and peer.role != host:
                first[peer.role] = peer
                todo.append(peer.role)
    while todo:
        h = todo.popleft()
        for ep in topo.endpoints(h):
            for peer in topo.segment_peers(ep):
                if peer.role not in first and peer.role != host:
                    first[peer.role] = first[h]
                    todo.append(peer.role)
    return first


def routes(topo: Topology) -> list[tuple[str, str, str, str]]:
    """(role, subnet, via, dev) for every subnet a host is not on, through the BFS next hop."""
    out = []
    for host in topo.hosts:
        own = {link.subnet for link in topo.links for e in (link.a, link.b) if e.role == host}
        hops = _next_hops(topo, host)
        done: set[str] = set()
        for h in hops:       # breadth-first order: a subnet is routed toward its nearest host
            for ep in topo.endpoints(h):
                subnet = next(link.subnet for link in topo.links if ep in (link.a, link.b))
                if subnet in own or subnet in done:
                    continue
                done.add(subnet)
                via = hops[h]
                dev = next(e.ifname for e in topo.endpoints(host) if via in topo.segment_peers(e))
                out.append((host, subnet, via.addr, dev))
    return out


def route_argv(topo: Topology, roles: tuple[str, ...] | None = None) -> list[list[str]]:
    return [["ip", "-n", topo.namespace(role), "route", "add", subnet, "via", via, "dev", dev]
            for role, subnet, via, dev in routes(topo) if roles is None or role in roles]


def bridge_argv(topo: Topology) -> list[list[str]]:
    """Each switch's bridge, up, in the switch's namespace."""
    return [argv for sw in topo.switches for argv in (
        ["ip", "-n", topo.namespace(sw), "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "-n", topo.namespace(sw), "link", "set", BRIDGE, "up"])]


def wiring_argv(topo: Topology, nodes: tuple[str, ...] | None = None) -> list[list[str]]:
    """A veth pair for every link between two of `nodes` (default: every host and switch; their namespaces
    and bridges exist), then every endpoint of `nodes` addressed, or enslaved to its bridge, forwarding on
    and routes. The VM lab passes its namespaces: their interfaces toward guests are taps it has made by then."""
    nodes = topo.hosts + topo.switches if nodes is None else nodes
    cmds = [["ip", "link", "add", link.a.ifname, "netns", topo.namespace(link.a.role), "type", "veth",
             "peer", "name", link.b.ifname, "netns", topo.namespace(link.b.role)]
            for link in topo.links if link.a.role in nodes and link.b.role in nodes]
    cmds += [argv for link in topo.links for ep in (link.a, link.b) if ep.role in nodes
             for argv in address_argv(topo, ep)]
    cmds += [["ip", "netns", "exec", topo.namespace(r), "sysctl", "-qw", "net.ipv4.ip_forward=1"]
             for r in topo.routers() if r in nodes]
    return cmds + route_argv(topo, nodes)


def build_argv(topo: Topology) -> list[list[str]]:
    """Every command that builds the lab, in order (neighbour entries need MACs: see neigh_argv)."""
    return namespace_argv(topo) + bridge_argv(topo) + wiring_argv(topo)


def neigh_argv(topo: Topology, macs: dict[tuple[str, str], str],
               roles: tuple[str, ...] | None = None) -> list[list[str]]:
    """Static neighbour entries for every data-path peer (G-ARP), a switch's hosts included;
    macs[(role, ifname)] -> lladdr. `roles` limits the entries to those namespaces (the VM lab's aqm
    configures its own)."""
    cmds = []
    for link in topo.links:
        for ep in (link.a, link.b):
            if ep.role not in topo.hosts or (roles is not None and ep.role not in roles):
                continue
            for peer in topo.segment_peers(ep):
                cmds.append(["ip", "-n", topo.namespace(ep.role), "neigh", "replace", peer.addr, "lladdr",
                             macs[(peer.role, peer.ifname)], "dev", ep.ifname, "nud", "permanent"])
    return cmds
