"""Pure checks: read-back equals the desired state, and a plan fits the hosts' capabilities.

`readback_differences` is what makes "apply" trustworthy: every requested sysctl, offload and qdisc
parameter is compared with what the kernel reports, and each mismatch is named.
"""
from __future__ import annotations

from orchestrator.engine import ack_policy, hostchecks
from orchestrator.engine.bind import QUEUE_TRACEPOINTS, egress_queue_sites
from orchestrator.engine.event_tasks import event_problems
from orchestrator.engine.ktrace import kernel_trace_problems, kernel_trace_unsupported
from orchestrator.plan import RunSpec
from orchestrator.plan.model.kernels import release_matches
from schemas import allowlist, protocol
from schemas.flag import Flag
from schemas.hoststate import HostState, InterfaceState, norm_module_param
from schemas.neighbours import permanent_neighbours
from schemas.nic import OFFLOAD_LONG_NAMES
from schemas.qdiscs import QdiscStage, kind_of


def norm_sysctl(value: str) -> str:
    return " ".join(str(value).split())


def stage_differences(dev: str, i: int, stage: QdiscStage, rb: protocol.InterfaceReadback) -> list[str]:
    """Kind, place in the chain and every option of stage i, as its kind expects tc to show them."""
    handle = f"{i + 1}:"
    where = f"{dev} qdisc {handle}"
    found = [q for q in rb.tc_qdisc if q.get("handle") == handle]
    if not found:
        return [f"{where}: missing (wanted {stage.kind})"]
    q = found[0]
    diffs = []
    kind = kind_of(stage)
    if q["kind"] != kind.tc_kind:
        diffs.append(f"{where}: kind {q['kind']} != {kind.tc_kind}")
        return diffs
    parent_ok = q.get("root") if i == 0 else q.get("parent") == f"{i}:1"
    if not parent_ok:
        diffs.append(f"{where}: not attached at {'root' if i == 0 else f'{i}:1'}")
    if kind.expected is None:
        return [*diffs, f"{where}: no read-back check for qdisc {kind.name}: {kind.pending}"]
    class_where = f"{dev} {stage.kind} class {i + 1}:1"
    cls = kind.class_readback(f"{i + 1}:1", rb.htb_classes, rb.tc_class_text) if kind.class_readback else None
    if kind.class_readback is not None and cls is None:
        diffs.append(f"{class_where}: missing")
    raw = [r for r in rb.raw_qdiscs if r.get("handle") == handle]
    if kind.netlink is not None and not raw:
        diffs.append(f"{where}: no netlink read-back of its options")
    shown = {**q, "class": cls, "netlink": raw[0] if raw else None}
    for expect in kind.expected(stage):
        in_class = expect.path[0] == "class"
        if in_class and cls is None:
            continue
        d = expect.difference(shown)
        if d is not None:
            diffs.append(f"{class_where if in_class else where}: {d}")
    return diffs


# Coalescing a driver cannot turn off, only hold at its floor, and why the floor does not delay a packet. UML's
# vector NIC keeps its TX timer in whole jiffies and clamps 0 to one (vector_set_coalesce); it arms that timer
# only while the stack says more packets follow (xmit_more), and sends at once on the last of a burst.
COALESCE_FLOORS = {("uml-vector", "tx-usecs"): (100_000, "its TX timer is at least one jiffy and runs only "
                                                          "while the stack announces more packets (xmit_more)")}


def coalesce_floor(driver: str | None, name: str, have: object, want: object) -> str | None:
    """Why `have` is the driver's floor for a request of `want` = 0 (off), or None when it is not."""
    floor = COALESCE_FLOORS.get((driver or "", name))
    if floor is None or want != 0 or not isinstance(have, int) or not 0 < have <= floor[0]:
        return None
    return f"{name} {have} is driver {driver}'s floor: {floor[1]}"


def nic_differences(dev: str, want: InterfaceState, irb: protocol.InterfaceReadback) -> list[str]:
    """Coalescing, pause frames and static neighbours. A driver without coalescing or pause frames
    satisfies a request for "off" (see nic_flags, G-NIC); anything else it cannot hold is a difference."""
    diffs = []
    have = irb.coalesce or {}
    for name, value in want.coalesce.items():
        if name not in have:
            if value:
                diffs.append(f"{dev} coalesce {name}: driver {irb.driver or '?'} has none, wanted {value}")
        elif have[name] != value and coalesce_floor(irb.driver, name, have[name], value) is None:
            diffs.append(f"{dev} coalesce {name}: {have[name]} != {value}")
    for name, on in want.pause.items():
        if irb.pause is None:
            if on:
                diffs.append(f"{dev} pause {name}: driver {irb.driver or '?'} has no pause frames, wanted on")
        elif irb.pause.get(name) != on:
            diffs.append(f"{dev} pause {name}: {irb.pause.get(name)} != {on}")
    permanent = permanent_neighbours(irb.neighbours)
    for addr, lladdr in want.neighbours.items():
        if permanent.get(addr) != lladdr.lower():
            diffs.append(f"{dev} neighbour {addr}: {permanent.get(addr) or 'not permanent'} != {lladdr} permanent")
    return diffs


def nic_flags(role: str, desired: HostState, rb: protocol.Readback) -> list[Flag]:
    """Requests held only because the driver lacks the mechanism (G-NIC): coalescing or pause frames asked
    off on a driver that has neither (veth, virtio), or coalescing at a driver's floor (COALESCE_FLOORS) --
    satisfied, and said so in the run record."""
    flags = []
    for dev, want in desired.interfaces.items():
        irb = rb.interfaces.get(dev)
        if irb is None:
            continue
        absent = sorted(k for k in want.coalesce if k not in (irb.coalesce or {}))
        if absent:
            flags.append(Flag(guard="G-NIC", host=role, message=f"{dev}: coalescing {', '.join(absent)} off by "
                              f"absence (driver {irb.driver or '?'}: "
                              f"{irb.unsupported.get('coalesce', 'no such parameter')})"))
        floors = [why for k, v in want.coalesce.items()
                  if (why := coalesce_floor(irb.driver, k, (irb.coalesce or {}).get(k), v)) is not None]
        flags += [Flag(guard="G-NIC", host=role, message=f"{dev}: coalescing off as far as it goes: {why}")
                  for why in floors]
        if want.pause and irb.pause is None:
            flags.append(Flag(guard="G-NIC", host=role, message=f"{dev}: pause frames off by absence (driver "
                              f"{irb.driver or '?'}: {irb.unsupported.get('pause', '?')})"))
    return flags


def readback_differences(desired: HostState, rb: protocol.Readback) -> list[str]:
    diffs = []
    for name, value in desired.sysctls.items():
        got = rb.sysctls.get(name)
        if got is None or norm_sysctl(got) != norm_sysctl(value):
            diffs.append(f"sysctl {name}: {got!r} != {value!r}")
    for module, params in desired.module_params.items():
        for param, value in params.items():
            got = rb.module_params.get(module, {}).get(param)
            if got is None or norm_module_param(got) != norm_module_param(value):
                diffs.append(f"module parameter {module}.{param}: {got!r} != {value!r}")
    for dev, ifstate in desired.interfaces.items():
        irb = rb.interfaces.get(dev)
        if irb is None:
            diffs.append(f"{dev}: no read-back")
            continue
        for short, on in ifstate.offloads.items():
            feat = irb.features.get(OFFLOAD_LONG_NAMES[short], {})
            if bool(feat.get("active")) != on:
                diffs.append(f"{dev} offload {short}: {'on' if feat.get('active') else 'off'} != "
                             f"{'on' if on else 'off'}")
        diffs += hostchecks.mtu_differences(dev, ifstate, irb)
        diffs += nic_differences(dev, ifstate, irb)
        diffs += ack_policy.quickack_differences(dev, ifstate, irb)
        for i, stage in enumerate(ifstate.qdiscs):
            diffs += stage_differences(dev, i, stage, irb)
        planned = {f"{i + 1}:" for i in range(len(ifstate.qdiscs))}
        extra = [q for q in irb.tc_qdisc if ifstate.qdiscs and q.get("handle") not in planned
                 and q.get("kind") not in ("ingress", "clsact")]
        diffs += [f"{dev} qdisc {q.get('handle')}: unexpected {q.get('kind')}" for q in extra]
    return diffs


def capability_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """What the plan needs that a host lacks, each naming host, kernel release and capability."""
    problems = []
    for role, hp in spec.hosts.items():
        c = caps.get(role)
        if c is None:
            problems.append(f"host {role}: not in the testbed")
            continue
        if hp.kernel is not None and not release_matches(hp.kernel.release, c.kernel_release):
            problems.append(f"host {role} runs kernel {c.kernel_release}, the plan needs variant "
                            f"{hp.kernel.name} (release {hp.kernel.release})")
        elif (hp.kernel is not None and hp.kernel.build_key and c.kernel_build is not None
              and c.kernel_build.build_key not in (None, hp.kernel.build_key)):
            problems.append(f"host {role} runs kernel {c.kernel_release} installed as build "
                            f"{c.kernel_build.build_key[:12]}, the plan needs variant {hp.kernel.name} build "
                            f"{hp.kernel.build_key[:12]}")
        for chain in hp.qdiscs.values():
            for stage in chain:
                if stage.kind not in c.qdiscs:
                    module = kind_of(stage).module
                    why = (f" (module {module}: not loaded, and not in the module directories of this host's "
                           "agent, --module-dir)") if module else ""
                    problems.append(f"host {role} (kernel {c.kernel_release}) lacks qdisc {stage.kind}{why}")
    for f in spec.flows:
        c = caps.get(f.src)
        if c and f.cc not in c.congestion_controls and not cc_loaded_by_plan(f.cc, spec.hosts.get(f.src), c):
            module = cc_module(f.cc)
            hint = (f"; its module {module} is loadable there: load it with hosts.{f.src}.module_params.{module}"
                    if module in c.loadable_modules else "")
            problems.append(f"host {f.src} (kernel {c.kernel_release}) lacks congestion control {f.cc} "
                            f"(available: {' '.join(c.congestion_controls)}){hint}")
    problems += nic_problems(spec, caps)
    problems += hostchecks.host_state_problems(spec, caps)
    problems += allowlist_problems(spec, caps)
    problems += unsupported_features(spec, caps)
    problems += kernel_trace_problems(spec.kernel_trace, caps)
    sender_needs = [  # (asked for, the sender has it, what it lacks)
        (spec.tcp_probe, lambda c: "tcp:tcp_probe" in c.tracepoints, "tracepoint tcp:tcp_probe"),
        (bool(spec.ss_interval_ms), lambda c: c.socket_diag,
         "tcp_diag: `ss -ti` would print no TCP_INFO for the ss sampler (load the tcp_diag module)")]
    for role in spec.senders:
        c = caps.get(role)
        problems += [f"host {role} (kernel {c.kernel_release}) lacks {what}"
                     for asked, has, what in sender_needs if c and asked and not has(c)]
    for role, toward in egress_queue_sites(spec):
        c = caps.get(role)
        missing = [tp for tp in QUEUE_TRACEPOINTS if c and tp not in c.tracepoints]
        if missing:
            s = "s" if len(missing) > 1 else ""
            problems.append(f"host {role} (kernel {c.kernel_release}) lacks tracepoint{s} {', '.join(missing)}: "
                            f"the queue toward {toward} is on its own egress, where only they time a packet's "
                            "wait (M-QDELAY)")
    return sorted(set(problems))


def cc_module(cc: str) -> str:
    """The module of a congestion control, by the kernel's own convention (it autoloads `tcp_<name>`)."""
    return f"tcp_{cc}"


def cc_loaded_by_plan(cc: str, hp, caps: protocol.Capabilities) -> bool:
    """A congestion control the host lacks until the plan loads its module there: `module_params` names
    tcp_<cc> and the agent has its file (loadable_modules)."""
    module = cc_module(cc)
    return hp is not None and module in hp.module_params and module in caps.loadable_modules


def allowlist_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """Sysctls and modules outside a host agent's allow-lists (the testbed's, reported in hello): the agent
    would refuse them, so the plan is refused before any host is touched."""
    out = []
    for role, hp in spec.hosts.items():
        c = caps.get(role)
        if c is None:
            continue
        out += [f"host {role}: {allowlist.sysctl_refusal(name, c.allowed_sysctl_prefixes)}"
                for name in hp.sysctls if not allowlist.sysctl_allowed(name, c.allowed_sysctl_prefixes)]
        out += [f"host {role}: {allowlist.module_refusal(module, c.allowed_modules)}"
                for module in hp.module_params if not allowlist.module_allowed(module, c.allowed_modules)]
    return out


def nic_problems(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """Coalescing or pause settings a data interface's driver cannot hold (asking for "off" always fits)."""
    out = []
    for role, hp in spec.hosts.items():
        c = caps.get(role)
        if c is None:
            continue
        for dev, params in c.coalesce_params.items():
            driver = c.drivers.get(dev, "?")
            lacking = sorted(k for k, v in hp.coalesce.items() if v and k not in params)
            if lacking:
                out.append(f"host {role} (kernel {c.kernel_release}) interface {dev} (driver {driver}) has no "
                           f"coalescing parameter {', '.join(lacking)}")
            if any(hp.pause.values()) and not c.pause_frames.get(dev, False):
                out.append(f"host {role} (kernel {c.kernel_release}) interface {dev} (driver {driver}) has no "
                           "pause frames")
    return out


def unsupported_features(spec: RunSpec, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """Plan features the agents cannot put in place yet: refused before any host is touched, never skipped."""
    out = hostchecks.unsupported_host_state(spec)
    for role, hp in spec.hosts.items():
        release = caps[role].kernel_release if role in caps else "?"
        if hp.kernel is not None and hp.kernel.release is None:
            out.append(f"host {role} (kernel {release}): variant {hp.kernel.name} is a source build whose release "
                       f"is known once built: `tcplab kernel build PLAN {hp.kernel.name}` builds it and "
                       f"`tcplab kernel install` puts it on the host (docs/kernels.md)")
    out += ack_policy.refusals(spec, caps)
    out += event_problems(spec)   # events run (agents/events.py) when their chain has the stage they change
    out += kernel_trace_unsupported(spec.kernel_trace, caps)
    return out
