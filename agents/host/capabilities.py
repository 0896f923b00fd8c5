"""Capability probe: what this host can really do, found by trying (never assumed from the kernel name).

Qdisc kinds are probed by adding each one, with the minimal valid parameters its registry entry gives
(`schemas/qdiscs/`), to a throw-away veth pair the agent creates inside its own namespace (so no
allow-listed or foreign interface is touched).
"""
from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

from pyroute2 import DiagSocket
from pyroute2.netlink.exceptions import NetlinkError

from agents.host import modules as kmod
from agents.host import tracefs_caps
from agents.host.hostos import host_os
from agents.host.readback import (
    read_coalesce,
    read_driver,
    read_features,
    read_fixed_offloads,
    read_link,
    read_pause,
    read_speed,
)
from agents.host.tunables import congestion_controls, sysctl_path
from agents.tcbatch import batch_line, failed_lines
from schemas import procs
from schemas.nic import OFFLOAD_LONG_NAMES
from schemas.protocol import Capabilities, KernelBuild
from schemas.qdiscs import KINDS

# qdiscs probed for the record (the hello's capabilities) that no stage builds
OTHER_QDISC_PROBES: dict[str, tuple[str, ...]] = {"pfifo_fast": ("pfifo_fast",), "sfq": ("sfq",),
                                                  "prio": ("prio",)}


def qdisc_probes() -> dict[str, tuple[str, ...]]:
    """kind -> minimal parameters that make it a valid root qdisc: every probed kind of the registry (a
    pending kind has no probe, so a plan that needs it is refused) and the few others above."""
    own = {name: k.probe for name, k in KINDS.items() if k.probe is not None}
    return {**own, **OTHER_QDISC_PROBES}


TRACEFS_ROOTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
TOOLS = {
    "iperf3": ["iperf3", "--version"],
    "tcpdump": ["tcpdump", "--version"],
    "tc": ["tc", "-V"],
    "ethtool": ["ethtool", "--version"],
    "ip": ["ip", "-V"],
}


# tracefs instances are kernel-wide: on a host several labs share (netns labs), each agent names its instances
# with its lab's prefix (--trace-prefix), so `lab down` of one lab removes its own and no other's
INSTANCE_PREFIX = ["tcplab"]
INSTANCE_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def set_instance_prefix(prefix: str) -> None:
    if not INSTANCE_PREFIX_RE.match(prefix):
        raise ValueError(f"tracefs instance prefix {prefix!r}: expected a lowercase name of letters and digits")
    INSTANCE_PREFIX[0] = prefix


def instance_name(kind: str, task_id: str) -> str:
    """`<prefix>-<kind>-<pid>-<task>`: the lab's prefix first (`lab down` removes `<prefix>-*`), then what
    makes it unique on the host."""
    return f"{INSTANCE_PREFIX[0]}-{kind}-{os.getpid()}-{task_id}"


def tracefs_root() -> Path | None:
    for root in TRACEFS_ROOTS:
        if (root / "instances").is_dir():
            return root
    return None


def own_module_loads(module_dirs: list[Path], allowed: list[str]) -> list[str]:
    """Modules of the registry's own kinds (sch_aqm_mark) this agent would load for the probe: allow-listed,
    not loaded, and with a file in its module directories. Without one the kind is not probed into the list."""
    wanted = {k.module for k in KINDS.values() if k.module is not None}
    return sorted(m for m in wanted if m in kmod.loadable(module_dirs, allowed) and not kmod.is_loaded(m))


def probe_qdiscs(module_dirs: list[Path] | None = None, allowed: list[str] | None = None) -> list[str]:
    """Kinds the kernel accepts as a root qdisc; the modules of tcplab's own kinds are loaded for it from the
    module directories (which proves that they load on this kernel: vermagic, symbols) and unloaded after."""
    suffix = secrets.token_hex(3)
    dev, peer = f"tlp{suffix}a", f"tlp{suffix}b"
    loaded = [m for m in own_module_loads(module_dirs or [], allowed or []) if _try_load(m, module_dirs or [])]
    procs.run(["ip", "link", "add", dev, "type", "veth", "peer", "name", peer])
    try:
        lines, add_lines = qdisc_probe_batch(dev, qdisc_probes())
        # one tc process for every probe (a process start costs 30-130 ms in a UML or TCG guest, and there are
        # ~20 kinds); -force goes on past a refused line and names each on stderr
        done = procs.run(["tc", "-force", "-batch", "-"], check=False, stdin_text=lines)
        return accepted_kinds(add_lines, failed_lines(done.stderr))
    finally:
        procs.run(["ip", "link", "del", dev], check=False)
        for m in loaded:
            kmod.unload(m)


def qdisc_probe_batch(dev: str, probes: dict[str, tuple[str, ...]]) -> tuple[str, dict[str, int]]:
    """The `tc -batch` text that adds each kind as the root qdisc of `dev` and deletes it again, then adds
    clsact; and the 1-based line of each kind's add (pure)."""
    lines, add_lines = [], {}
    for kind, params in probes.items():
        lines.append(batch_line(["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", *params]))
        add_lines[kind] = len(lines)
        lines.append(batch_line(["tc", "qdisc", "del", "dev", dev, "root"]))
    lines.append(batch_line(["tc", "qdisc", "add", "dev", dev, "clsact"]))
    add_lines["clsact"] = len(lines)
    return "".join(f"{line}\n" for line in lines), add_lines


def accepted_kinds(add_lines: dict[str, int], failed: list[int]) -> list[str]:
    """The kinds whose add line tc did not report as failed, sorted (pure)."""
    refused = set(failed)
    return sorted(kind for kind, line in add_lines.items() if line not in refused)


def _try_load(module: str, module_dirs: list[Path]) -> bool:
    try:
        return kmod.load(module, {}, module_dirs)
    except Exception:   # noqa: BLE001 - a module that does not load here is a capability the host lacks
        return False


def _first_line(argv: list[str]) -> str:
    try:
        done = procs.run(argv, check=False, timeout=5)
    except procs.ToolMissing:
        return "missing"
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0] if text else "unknown"


def tcp_socket_diag() -> bool:
    """Whether inet_diag answers a TCP dump (needs tcp_diag): what `ss -ti` needs for TCP_INFO."""
    try:
        with DiagSocket() as diag:
            diag.bind()
            diag.get_sock_stats(family=socket.AF_INET)
        return True
    except (NetlinkError, OSError):
        return False


KERNEL_RECORDS = Path("/etc/tcplab/kernels")   # written by playbooks/kernel-install.yml
KERNEL_RECORD_MAX = 4096


def installed_build(release: str, records: Path = KERNEL_RECORDS) -> KernelBuild | None:
    """The record kernel-install.yml left for the running release; None when there is none or it is not one
    (a root agent reads at most 4 KiB of it and trusts nothing it cannot validate)."""
    path = records / f"{release}.json"
    try:
        with open(path, "rb") as f:
            raw = f.read(KERNEL_RECORD_MAX + 1)
        if len(raw) > KERNEL_RECORD_MAX:
            return None
        found = KernelBuild.model_validate_json(raw)
    except (OSError, ValueError):
        return None
    return found if found.release == release else None


def probe(interfaces: list[str], sysctl_prefixes: list[str], modules: list[str],
          module_dirs: list[Path] | None = None) -> Capabilities:
    """What the host can do, and what this agent may be asked to write (its allow-lists, reported as given)."""
    root = tracefs_root()
    tracepoints = tracefs_caps.tracepoints(root)
    features: dict[str, dict[str, bool]] = {}
    for dev in interfaces:
        feats = read_features(dev)
        features[dev] = {short: not bool(feats[long].get("fixed"))
                         for short, long in OFFLOAD_LONG_NAMES.items() if long in feats}
    coalesce = {dev: sorted(read_coalesce(dev)[0] or {}) for dev in interfaces}
    ccs = congestion_controls()
    drivers = {dev: read_driver(dev) for dev in interfaces}
    return Capabilities(
        kernel_release=os.uname().release,
        kernel_build=installed_build(os.uname().release),
        qdiscs=probe_qdiscs(module_dirs, modules),
        congestion_controls=ccs["available"],
        allowed_congestion_controls=ccs["allowed"],
        offload_features=features,
        coalesce_params=coalesce,
        pause_frames={dev: read_pause(dev)[0] is not None for dev in interfaces},
        drivers=drivers,
        os=host_os(),
        fixed_offloads={dev: read_fixed_offloads(dev) for dev in interfaces},
        link_speeds={dev: read_speed(dev, drivers[dev]) for dev in interfaces},
        mtu_range={dev: read_link(dev)[1:] for dev in interfaces},
        tools={name: _first_line(argv) for name, argv in TOOLS.items()},
        tracepoints=tracepoints,
        kprobe_events=tracefs_caps.kprobe_events(root),
        tracers=tracefs_caps.tracers(root),
        trace_printk_dest=tracefs_caps.trace_printk_dest(root),
        socket_diag=tcp_socket_diag(),
        tcp_delayed_acks=sysctl_path("net.ipv4.tcp_delayed_acks").exists(),
        boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        allowed_sysctl_prefixes=list(sysctl_prefixes),
        allowed_modules=list(modules),
        loadable_modules=kmod.loadable(module_dirs or [], modules),
    )
