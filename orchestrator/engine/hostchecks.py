"""Pure checks of the host state a plan states beyond sysctls and qdiscs: the MTU, the operating system, the
offloads a driver fixed and the bottleneck's line rate (G-HETERO, G-NIC; docs/host-state.md).

Everything a host cannot hold is refused at preflight, before any host is touched, naming host, interface and
what is missing; what cannot be checked (a virtual NIC's speed) is recorded with the run as a G-NIC flag.
"""
from __future__ import annotations

from orchestrator.inventory import Inventory
from orchestrator.plan import LinkRef, RunSpec
from schemas import protocol
from schemas.flag import Flag
from schemas.hoststate import Htb, InterfaceState

# the plan's name of an operating system -> platform.uname().system of a host running it
OS_SYSTEMS = {"linux": "Linux", "freebsd": "FreeBSD"}
# operating systems the agent's mechanisms do not exist on, and why
AGENT_UNSUPPORTED_OS = {"freebsd": "the agent's mechanisms (tc, ethtool, tracefs, netlink) are Linux-only"}
DEFAULT_MTU = 1500


def mtu_differences(dev: str, want: InterfaceState, irb: protocol.InterfaceReadback) -> list[str]:
    if want.mtu is None or irb.mtu == want.mtu:
        return []
    return [f"{dev} mtu: {irb.mtu if irb.mtu is not None else 'not read back'} != {want.mtu}"]


def os_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """A host whose OS is not the one the plan names for it (an agent too old to report its OS cannot show it)."""
    out = []
    for role, hp in spec.hosts.items():
        c = caps.get(role)
        if hp.os is None or c is None:
            continue
        if c.os is None:
            out.append(f"host {role}: the plan needs OS {hp.os}; its agent does not report its OS (upgrade it)")
        elif c.os.system != OS_SYSTEMS[hp.os]:
            out.append(f"host {role} runs {c.os.pretty or c.os.system} ({c.os.system}), the plan needs OS {hp.os}")
    return out


def fixed_offload_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """An offload asked at a value other than the one the driver fixed it at (`[fixed]` in `ethtool -k`): the
    agent would fail at apply, so the plan is refused first, naming host, interface, driver and feature."""
    out = []
    for role, hp in spec.hosts.items():
        c = caps.get(role)
        if c is None:
            continue
        for dev, fixed in sorted(c.fixed_offloads.items()):
            for name, on in sorted(hp.offloads.items()):
                if name in fixed and fixed[name] != on:
                    out.append(f"host {role} (kernel {c.kernel_release}) interface {dev} (driver "
                               f"{c.drivers.get(dev, '?')}): offload {name} is fixed "
                               f"{'on' if fixed[name] else 'off'} by the driver, the plan asks "
                               f"{'on' if on else 'off'}")
    return out


def mtu_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """The run's MTU outside what a data interface takes (its min_mtu..max_mtu)."""
    out = []
    for role in spec.hosts:
        c = caps.get(role)
        for dev, (lo, hi) in sorted(c.mtu_range.items()) if c else ():
            if not lo <= spec.mtu <= hi:
                out.append(f"host {role} interface {dev} (driver {c.drivers.get(dev, '?')}) takes an MTU of "
                           f"{lo}..{hi}, the plan's mtu is {spec.mtu}")
    return out


def unsupported_host_state(spec: RunSpec) -> list[str]:
    """What of the host state no agent puts in place: an OS the agent does not run on; an MTU other than
    1500 across a switch (a switch has no agent, so its ports keep theirs)."""
    out = [f"host {role}: OS {hp.os} is not supported: {AGENT_UNSUPPORTED_OS[hp.os]}"
           for role, hp in spec.hosts.items() if hp.os in AGENT_UNSUPPORTED_OS]
    if spec.mtu != DEFAULT_MTU and spec.testbed.switches:
        out.append(f"mtu {spec.mtu} with switches ({', '.join(spec.testbed.switches)}): a switch has no agent to "
                   f"set its ports' MTU, which stays {DEFAULT_MTU}")
    return out


def host_state_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    return os_problems(spec, caps) + fixed_offload_problems(spec, caps) + mtu_problems(spec, caps)


# ------------------------------------------------------------------ line rate (G-NIC)

def bottleneck_links(spec: RunSpec) -> list[LinkRef]:
    """The interfaces that carry the bottleneck: a chain with an htb at the bottleneck rate (the expansion's
    bottleneck chain, expansion/build.py)."""
    rate = spec.derived.bottleneck_rate_bit
    return [LinkRef(host=role, toward=toward) for role, hp in spec.hosts.items()
            for toward, chain in hp.qdiscs.items()
            if rate is not None and any(isinstance(s, Htb) and s.rate_bit == rate for s in chain)]


def _bottleneck_speeds(spec: RunSpec, caps: dict[str, protocol.Capabilities], inv: Inventory):
    """(link, interface, driver, its LinkSpeed) of each bottleneck interface of the testbed."""
    for link in bottleneck_links(spec):
        c, entry = caps.get(link.host), inv.hosts.get(link.host)
        if c is None or entry is None:
            continue
        try:
            dev = entry.iface_toward(link.toward)
        except KeyError:
            continue
        speed = c.link_speeds.get(dev) or protocol.LinkSpeed(why="its agent reports no link speed (upgrade it)")
        yield link, dev, c.drivers.get(dev, "?"), speed


def line_rate_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities], inv: Inventory) -> list[str]:
    """A physical NIC whose speed is not the plan's `line_rate` (G-NIC): netem's limit and the burst the queue
    sees were sized for another link, so the run is refused."""
    line = spec.derived.line_rate_bit
    if line is None:
        return []
    return [f"host {link.host} interface {dev} (driver {driver}) links at {speed.mbps} Mb/s, the plan's "
            f"bottleneck line_rate is {line / 1e6:g} Mbit/s (G-NIC)"
            for link, dev, driver, speed in _bottleneck_speeds(spec, caps, inv)
            if speed.checkable and speed.mbps is not None and speed.mbps * 10**6 != line]


def line_rate_flags(spec: RunSpec, caps: dict[str, protocol.Capabilities], inv: Inventory) -> list[Flag]:
    """A `line_rate` no NIC could confirm (a virtual driver, an unknown speed): recorded with the run."""
    line = spec.derived.line_rate_bit
    if line is None:
        return []
    return [Flag(guard="G-NIC", host=link.host,
                 message=f"{dev}: line rate not checkable on driver {driver} ({speed.why}; it reports "
                         f"{f'{speed.mbps} Mb/s' if speed.mbps is not None else 'Unknown!'}); the plan states "
                         f"{line / 1e6:g} Mbit/s",
                 evidence={"line_rate_bit": line, "reported_mbps": speed.mbps})
            for link, dev, driver, speed in _bottleneck_speeds(spec, caps, inv) if not speed.checkable]
