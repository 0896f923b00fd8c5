"""Pure checks: read-back equals the desired state, and a plan fits the hosts' capabilities.

`readback_differences` is what makes "apply" trustworthy: every requested sysctl, offload and qdisc
parameter is compared with what the kernel reports, and each mismatch is named.
"""
from __future__ import annotations

import re

from agents.host.argv import OFFLOAD_LONG_NAMES
from agents.host.ethtool import permanent_neighbours
from orchestrator.plan import RunSpec
from schemas import protocol
from schemas.hoststate import (
    Bfifo,
    Cake,
    Codel,
    Fq,
    FqCodel,
    FqPie,
    HostState,
    Htb,
    InterfaceState,
    Netem,
    Pfifo,
    Pie,
    QdiscStage,
    Red,
    Tbf,
)

SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMG]?)b$")


def norm_sysctl(value: str) -> str:
    return " ".join(str(value).split())


def parse_tc_size(text: str) -> int:
    """tc's printed sizes ("15Kb", "1514b", "1Mb"): 1024-based multipliers."""
    m = SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a tc size: {text!r}")
    return int(float(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2)])


def htb_class_bursts(text: str) -> dict[str, tuple[int, int]]:
    """classid -> (burst, cburst) in bytes from `tc -d class show` text."""
    out = {}
    for m in re.finditer(r"class htb (\S+) .*?burst (\S+?)(?:/\d+)? .*?cburst (\S+?)(?:/\d+)? ", text):
        out[m.group(1)] = (parse_tc_size(m.group(2)), parse_tc_size(m.group(3)))
    return out


def _close(a: int, b: int, rel: float = 0.02, abs_: int = 1024) -> bool:
    # tc prints sizes rounded to 1024-multiples, so burst read-back is approximate by design
    return abs(a - b) <= max(abs_, rel * b)


def stage_differences(dev: str, i: int, stage: QdiscStage, rb: protocol.InterfaceReadback) -> list[str]:
    handle = f"{i + 1}:"
    where = f"{dev} qdisc {handle}"
    found = [q for q in rb.tc_qdisc if q.get("handle") == handle]
    if not found:
        return [f"{where}: missing (wanted {stage.kind})"]
    q = found[0]
    diffs = []
    if q["kind"] != stage.kind:
        diffs.append(f"{where}: kind {q['kind']} != {stage.kind}")
        return diffs
    parent_ok = q.get("root") if i == 0 else q.get("parent") == f"{i}:1"
    if not parent_ok:
        diffs.append(f"{where}: not attached at {'root' if i == 0 else f'{i}:1'}")
    opts = q.get("options", {})
    if isinstance(stage, Pfifo) and opts.get("limit") != stage.limit_packets:
        diffs.append(f"{where}: limit {opts.get('limit')} != {stage.limit_packets} packets")
    if isinstance(stage, Bfifo) and opts.get("limit") != stage.limit_bytes:
        diffs.append(f"{where}: limit {opts.get('limit')} != {stage.limit_bytes} bytes")
    if isinstance(stage, Tbf) and opts.get("rate") not in (None, stage.rate_bit // 8):
        diffs.append(f"{where}: rate {opts.get('rate')} B/s != {stage.rate_bit // 8} B/s")
    if isinstance(stage, Htb):
        diffs += _htb_class_differences(dev, i, stage, rb)
    diffs += [f"{where}: {d}" for d in aqm_option_differences(stage, opts)]
    return diffs


def _us(ns: int | None) -> int | None:
    return None if ns is None else ns // 1000


def _want(stage: QdiscStage) -> list[tuple[str, object, object]]:
    """(option, read-back path, wanted value) per stage kind, in the units `tc -j` prints (µs, bytes)."""
    if isinstance(stage, Netem):
        out = [("limit", "limit", stage.limit_packets), ("delay", ("delay", "delay"), stage.delay_ns / 1e9),
               ("jitter", ("delay", "jitter"), stage.jitter_ns / 1e9)]
        return out + ([("loss", ("loss-random", "loss"), stage.loss)] if stage.loss else [])
    if isinstance(stage, Red):
        return [("limit", "limit", stage.limit_bytes), ("min", "min", stage.min_bytes),
                ("max", "max", stage.max_bytes), ("ecn", "ecn", stage.ecn), ("adaptive", "adaptive", stage.adaptive),
                ("nodrop", "nodrop", stage.nodrop),
                ("probability", "probability", stage.probability)]
    if isinstance(stage, (FqCodel, Codel)):
        return [("limit", "limit", stage.limit_packets), ("target", "target", _us(stage.target_ns)),
                ("interval", "interval", _us(stage.interval_ns)),
                ("ce_threshold", "ce_threshold", _us(stage.ce_threshold_ns))] + \
               ([("ecn", "ecn", stage.ecn)] if isinstance(stage, FqCodel) else [])
    if isinstance(stage, (Pie, FqPie)):
        return [("limit", "limit", stage.limit_packets), ("target", "target", _us(stage.target_ns)),
                ("tupdate", "tupdate", _us(stage.tupdate_ns))] + ([("ecn", "ecn", stage.ecn)]
                                                                  if isinstance(stage, Pie) else [])
    if isinstance(stage, Cake):
        return [("bandwidth", "bandwidth", None if stage.bandwidth_bit is None else stage.bandwidth_bit // 8),
                ("rtt", "rtt", _us(stage.rtt_ns)), ("flowmode", "flowmode", stage.flow_mode),
                ("diffserv", "diffserv", stage.diffserv),
                ("ack-filter", "ack-filter", "enabled" if stage.ack_filter else "disabled"),
                ("overhead", "overhead", stage.overhead_bytes)]
    if isinstance(stage, Fq):
        return [("limit", "limit", stage.limit_packets), ("flow_limit", "flow_limit", stage.flow_limit_packets),
                ("initial_quantum", "initial_quantum", stage.initial_quantum_bytes),
                ("maxrate", "maxrate", None if stage.maxrate_bit is None else stage.maxrate_bit // 8)]
    return []


def aqm_option_differences(stage: QdiscStage, opts: dict) -> list[str]:
    """Compare the options tc reports with the requested ones. tc rounds times to µs (codel prints
    4999 for 5 ms), so numbers agree within 0.1 % or one unit; unset options keep tc's defaults."""
    diffs = []
    for name, path, want in _want(stage):
        if want is None:
            continue
        got: object = opts
        for key in (path if isinstance(path, tuple) else (path,)):
            got = got.get(key) if isinstance(got, dict) else None
        if isinstance(want, (bool, str)) or got is None or isinstance(got, (bool, str)):
            ok = got == want
        else:
            ok = abs(float(got) - float(want)) <= max(1e-6, 1e-3 * abs(float(want)), 1.0 if float(want) > 100 else 0)
        if not ok:
            diffs.append(f"{name} {got} != {want}")
    return diffs


def _htb_class_differences(dev: str, i: int, stage: Htb, rb: protocol.InterfaceReadback) -> list[str]:
    classid = f"{i + 1}:1"
    where = f"{dev} htb class {classid}"
    cls = [c for c in rb.htb_classes if c["classid"] == classid]
    if not cls:
        return [f"{where}: missing"]
    c, diffs = cls[0], []
    if c["rate_bit"] != stage.rate_bit:
        diffs.append(f"{where}: rate {c['rate_bit']} != {stage.rate_bit} bit/s")
    if c["ceil_bit"] != (stage.ceil_bit or stage.rate_bit):
        diffs.append(f"{where}: ceil {c['ceil_bit']} != {stage.ceil_bit or stage.rate_bit} bit/s")
    if stage.quantum_bytes and c["quantum_bytes"] != stage.quantum_bytes:
        diffs.append(f"{where}: quantum {c['quantum_bytes']} != {stage.quantum_bytes}")
    bursts = htb_class_bursts(rb.tc_class_text).get(classid)
    if stage.burst_bytes and bursts and not _close(bursts[0], stage.burst_bytes):
        diffs.append(f"{where}: burst {bursts[0]} != {stage.burst_bytes} bytes")
    want_cb = stage.cburst_bytes or stage.burst_bytes
    if want_cb and bursts and not _close(bursts[1], want_cb):
        diffs.append(f"{where}: cburst {bursts[1]} != {want_cb} bytes")
    return diffs


def norm_module_param(value: str) -> str:
    """Boolean module parameters read back as Y/N whatever was written (1, y, true): compare as 1/0."""
    v = str(value).strip()
    return {"y": "1", "true": "1", "n": "0", "false": "0"}.get(v.lower(), v)


def nic_differences(dev: str, want: InterfaceState, irb: protocol.InterfaceReadback) -> list[str]:
    """Coalescing, pause frames and static neighbours. A driver without coalescing or pause frames
    satisfies a request for "off" (see nic_notes); anything else it cannot hold is a difference."""
    diffs = []
    have = irb.coalesce or {}
    for name, value in want.coalesce.items():
        if name not in have:
            if value:
                diffs.append(f"{dev} coalesce {name}: driver {irb.driver or '?'} has none, wanted {value}")
        elif have[name] != value:
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


def nic_notes(desired: HostState, rb: protocol.Readback) -> list[str]:
    """Requests held only because the driver lacks the mechanism: listed in the run record (G-SYSCTL)."""
    notes = []
    for dev, want in desired.interfaces.items():
        irb = rb.interfaces.get(dev)
        if irb is None:
            continue
        absent = sorted(k for k in want.coalesce if k not in (irb.coalesce or {}))
        if absent:
            notes.append(f"{dev}: coalescing {', '.join(absent)} off by absence (driver {irb.driver or '?'}: "
                         f"{irb.unsupported.get('coalesce', 'no such parameter')})")
        if want.pause and irb.pause is None:
            notes.append(f"{dev}: pause frames off by absence (driver {irb.driver or '?'}: "
                         f"{irb.unsupported.get('pause', '?')})")
    return notes


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
        diffs += nic_differences(dev, ifstate, irb)
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
        if hp.kernel is not None and hp.kernel.release not in (None, c.kernel_release):
            problems.append(f"host {role} runs kernel {c.kernel_release}, the plan needs variant "
                            f"{hp.kernel.name} (release {hp.kernel.release})")
        for chain in hp.qdiscs.values():
            for stage in chain:
                if stage.kind not in c.qdiscs:
                    problems.append(f"host {role} (kernel {c.kernel_release}) lacks qdisc {stage.kind}")
    for f in spec.flows:
        c = caps.get(f.src)
        if c and f.cc not in c.congestion_controls:
            problems.append(f"host {f.src} (kernel {c.kernel_release}) lacks congestion control {f.cc} "
                            f"(available: {' '.join(c.congestion_controls)})")
    problems += nic_problems(spec, caps)
    problems += unsupported_features(spec, caps)
    sender_needs = [  # (asked for, the sender has it, what it lacks)
        (spec.tcp_probe, lambda c: "tcp:tcp_probe" in c.tracepoints, "tracepoint tcp:tcp_probe"),
        (bool(spec.ss_interval_ms), lambda c: c.socket_diag,
         "tcp_diag: `ss -ti` would print no TCP_INFO for the ss sampler (load the tcp_diag module)")]
    for role in spec.senders:
        c = caps.get(role)
        problems += [f"host {role} (kernel {c.kernel_release}) lacks {what}"
                     for asked, has, what in sender_needs if c and asked and not has(c)]
    return sorted(set(problems))


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
    out = []
    for role, hp in spec.hosts.items():
        release = caps[role].kernel_release if role in caps else "?"
        if hp.kernel is not None and hp.kernel.release is None:
            out.append(f"host {role} (kernel {release}): variant {hp.kernel.name} is a source build; "
                       "install it first (playbooks/kernel.yml) and give its `release`")
    for f in spec.flows:
        if f.tool == "app_limited":
            out.append(f"host {f.src}: flow {f.flow_id} needs the app-limited writer, which this agent "
                       "version does not have")
    if spec.ack_policy is not None and spec.ack_policy.mechanism != "stock":
        out.append(f"ack_policy mechanism {spec.ack_policy.mechanism} is not applied by this agent version")
    for e in spec.events:
        out.append(f"host {e.link.host}: event {e.action} at {e.at_s:g}s is not executed by this agent version")
    return out
