"""The UML lab's layout as data (pure): every host of the topology a User-Mode Linux kernel, its NICs as taps
on bridges inside one namespace of the lab's own, and the argv that starts each kernel.

- The wire namespace `<prefix>-uml-net` holds everything on the host side: one bridge per point-to-point
  link (`l<N>`) and per switch (`s<N>`), one tap per host NIC enslaved to its segment's bridge, and the
  control bridge `ctl` (10.198.0.254/24) with a tap per host. Role names have no `-`, so the namespace never
  names a host's. Nothing of the lab exists in the root namespace: the manager reaches the agents with
  sockets opened inside the wire namespace (orchestrator.netns_socket).
- Each host is `linux.uml` (Debian's package) or a project-built `arch: um` kernel, started inside the wire
  namespace so its vector NICs (`transport=tap`) find their taps. Its root is the machine's `/` over hostfs,
  read-only; stage 1 (uml_init.sh) mounts the guest's own tmpfs, the kept paths and the kernel's modules,
  stage 2 is the VM lab's guest PID 1 (orchestrator.lab.vm_guest): same network setup, same agent.
- Every host reads the machine's clock (UML has no clock of its own): no calibration, one clock for the lab.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.lab.netns import LabError
from orchestrator.lab.topology import Topology
from orchestrator.lab.vm_config import guest_config, guest_mac

WIRE_SUFFIX = "uml-net"
CONTROL_NET = "10.198.0"
CONTROL_BRIDGE = "ctl"
CONTROL_HOST_OCTET = 254          # the wire namespace's address on the control bridge
AGENT_PORT = 7100                 # every host's agent, on its own control address
EXEC_PORT = 7101                  # every host's exec port (`tcplab lab exec`), token-checked
DATA_MTU = 9000                   # taps, bridges and the guests' data NICs: the most a plan's MTU may be
GUEST_DEFAULT_MTU = 1500          # a data NIC's MTU after boot
# a UML host's memory is a file of the machine's, touched page by page: the size is a bound, not a cost. Half of
# it is the tmpfs the agent's artifacts go to (captures of a 1 Gbit/s run took more than 192 MB)
MEMORY_MB = 1536
MAX_HOSTS = 200                   # control addresses .1 ... .200
SAFE_ARG = re.compile(r"^[A-Za-z0-9._/+:=,-]*$")  # UML's command line splits on spaces; no quoting exists


def wire_namespace(prefix: str) -> str:
    return f"{prefix}-{WIRE_SUFFIX}"


def uml_dir(state_dir: Path, role: str) -> Path:
    """Everything of one UML host on the manager's side: console.log, guest/ (token, guest.json)."""
    return state_dir / f"uml-{role}"


def umid(prefix: str, role: str) -> str:
    """UML's instance id (its directory under uml_dir=): the lab's prefix keeps two labs apart."""
    return f"{prefix}-{role}"


@dataclass(frozen=True)
class UmlNic:
    """One NIC of a UML host: its name inside the guest, its MAC, and its tap and bridge in the wire namespace."""
    ifname: str
    mac: str
    tap: str
    bridge: str


def _host_index(topo: Topology, role: str) -> int:
    return topo.hosts.index(role)


def segment_bridges(topo: Topology) -> dict[str, str]:
    """subnet -> bridge name: `s<N>` for a switch's segment (N: the switch's index), `l<N>` for a link's."""
    out: dict[str, str] = {}
    for i, link in enumerate(topo.links):
        sw = next((e.role for e in (link.a, link.b) if e.role in topo.switches), None)
        out.setdefault(link.subnet, f"s{topo.switches.index(sw)}" if sw else f"l{i}")
    return out


def control_mac(topo: Topology, role: str) -> str:
    return f"52:54:00:7d:{_host_index(topo, role):02x}:fe"


def control_addr(topo: Topology, role: str) -> str:
    return f"{CONTROL_NET}.{_host_index(topo, role) + 1}"


def host_nics(topo: Topology, role: str) -> list[UmlNic]:
    """The data NICs of `role` in link order, then its control NIC (vec0, vec1, ... in that order)."""
    if len(topo.hosts) > MAX_HOSTS:
        raise LabError(f"the UML lab numbers at most {MAX_HOSTS} hosts; the topology has {len(topo.hosts)}")
    h = _host_index(topo, role)
    bridges = segment_bridges(topo)
    nics = []
    for n, ep in enumerate(topo.endpoints(role)):
        subnet = next(link.subnet for link in topo.links if ep in (link.a, link.b))
        nics.append(UmlNic(ep.ifname, guest_mac(topo, ep), f"h{h}n{n}", bridges[subnet]))
    return [*nics, UmlNic("ctl", control_mac(topo, role), f"h{h}c", CONTROL_BRIDGE)]


def lab_macs(topo: Topology) -> dict[tuple[str, str], str]:
    """(role, ifname) -> MAC for every data interface of every host (all fixed: every host is a guest)."""
    return {(role, ep.ifname): guest_mac(topo, ep) for role in topo.hosts for ep in topo.endpoints(role)}


def wire_argv(topo: Topology) -> list[list[str]]:
    """Build the wire namespace: bridges (no STP: ports forward at once), every host's taps on them, the
    control bridge's address. Data taps and bridges carry DATA_MTU so a plan's MTU is set inside the guests."""
    ns = wire_namespace(topo.prefix)
    ip = ["ip", "-n", ns]
    cmds = [["ip", "netns", "add", ns], [*ip, "link", "set", "lo", "up"]]
    bridges = sorted(set(segment_bridges(topo).values())) + [CONTROL_BRIDGE]
    for br in bridges:
        cmds += [[*ip, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0"],
                 [*ip, "link", "set", br, "up"]]
    for role in topo.hosts:
        for nic in host_nics(topo, role):
            mtu = "1500" if nic.bridge == CONTROL_BRIDGE else str(DATA_MTU)
            # sg off on the host side of every tap: the kernel then drops TSO from it (TSO needs SG), whatever
            # offloads the guest's driver asks for when it opens the tap, so a guest's TSO super-packet is cut
            # into MTU frames on the way in to the next host -- the wire a TSO NIC puts them on -- instead of
            # arriving whole (the receiving driver, gro=0, has MTU-sized buffers and would drop it)
            cmds += [[*ip, "tuntap", "add", "dev", nic.tap, "mode", "tap"],
                     ["ip", "netns", "exec", ns, "ethtool", "-K", nic.tap, "sg", "off"],
                     [*ip, "link", "set", nic.tap, "mtu", mtu, "master", nic.bridge, "up"]]
    for br in bridges[:-1]:
        cmds.append([*ip, "link", "set", br, "mtu", str(DATA_MTU)])
    cmds.append([*ip, "addr", "add", f"{CONTROL_NET}.{CONTROL_HOST_OCTET}/24", "dev", CONTROL_BRIDGE])
    return cmds


def host_config(topo: Topology, role: str, module_dirs: Iterable[str] = ()) -> dict:
    """guest.json for stage 2 (orchestrator.lab.vm_guest): the VM lab's, with the control interface on the
    wire namespace's control bridge, the exec port on it, and no clock to set."""
    cfg = guest_config(topo, role, AGENT_PORT, lab_macs(topo), module_dirs,
                       control=(control_mac(topo, role), control_addr(topo, role)), clock=False, exec_port=EXEC_PORT)
    cfg["agent"] += ["--trace-prefix", topo.prefix]
    # the data NICs are configured for DATA_MTU (their buffers, and the most a plan may set) and start at
    # Ethernet's 1500, what a host without a plan's MTU has
    for ifc in cfg["interfaces"]:
        if ifc["ifname"] != "ctl":
            ifc["mtu"] = GUEST_DEFAULT_MTU
    # IPv4 only: no router solicitations, MLD or link-local routes on the data links (they would appear in
    # captures, and a route born after the agent's baseline would read as a reset left undone)
    cfg["sysctls"] = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1",
                      **cfg["sysctls"]}
    return cfg


def uml_argv(binary: Path, topo: Topology, role: str, state_dir: Path, init: Path, env: dict[str, str],
             memory_mb: int = MEMORY_MB) -> list[str]:
    """One UML host, run inside the wire namespace. `env`: variables for stage 1 (UML hands unknown
    `KEY=value` words of its command line to init's environment)."""
    words = [f"umid={umid(topo.prefix, role)}", f"uml_dir={state_dir / 'uml'}", f"mem={memory_mb}M",
             "root=/dev/root", "rootfstype=hostfs", "rootflags=/", "ro", f"init={init}"]
    # depth: the vector ring per queue; gro off so the aqm's qdisc sees wire packets, as a router would
    # mtu: a data NIC's buffers and its largest MTU (uml-vector-max-mtu.patch), so plans may set jumbo frames
    words += [f"vec{i}:transport=tap,ifname={nic.tap},depth=128,gro=0,mac={nic.mac}"
              + ("" if nic.bridge == CONTROL_BRIDGE else f",mtu={DATA_MTU}")
              for i, nic in enumerate(host_nics(topo, role))]
    words += ["con=null", "con0=null,fd:1", "ssl=null", "quiet"]
    words += [f"{k}={v}" for k, v in env.items()]
    for w in [str(binary), *words]:
        if not SAFE_ARG.match(w):
            raise LabError(f"{w!r}: the UML lab needs paths and values without spaces or shell characters")
    return ["ip", "netns", "exec", wire_namespace(topo.prefix), str(binary), *words]


def stage1_env(guest_dir: Path, python: str, repo: Path, keep: Sequence[str], modules_root: Path | None) -> dict:
    """What uml_init.sh reads (paths only: the token stays in guest_dir, 0700)."""
    env = {"TCPLAB_GUEST": str(guest_dir), "TCPLAB_PYTHON": python, "TCPLAB_REPO": str(repo)}
    if keep:
        env["TCPLAB_KEEP"] = ",".join(keep)
    if modules_root is not None:
        env["TCPLAB_MODULES"] = str(modules_root)
    return env


# A UML kernel whose compile-time buffer for the host's XSAVE area is smaller than the host CPU's (AMX tiles:
# 10688 bytes; Linux 6.1 assumes 2696) cannot restore any process's registers: init dies at once.
XSTATE_FAILURE = "ptrace set fp regs failed"


def console_hint(console_tail: str) -> str | None:
    """What to do about a UML kernel that died, when its console shows a known cause."""
    if XSTATE_FAILURE in console_tail:
        return ("this UML kernel cannot run processes on this CPU: its buffer for the CPU's XSAVE area (AVX-512, "
                "AMX) is too small. The project's build carries the fix (experiments/kernels/patches/"
                "uml-host-xstate.patch): `tcplab kernel uml --build`, then bring the lab up again")
    return None
