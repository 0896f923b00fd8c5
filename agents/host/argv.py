"""Pure argv builders for tc and ethtool: desired state in kernel units -> command lines.

Chain layout: stage i gets handle `i+1:`; stage i>0 hangs below `i:1` (htb's default class, or the
single inner class of netem/tbf). Classless leaf qdiscs (pfifo, bfifo) must come last.
"""
from __future__ import annotations

from schemas.hoststate import (
    CLASSFUL_KINDS,
    Bfifo,
    Cake,
    Codel,
    DualPi2,
    Fq,
    FqCodel,
    FqPie,
    Htb,
    Netem,
    Pfifo,
    Pie,
    QdiscStage,
    Red,
    Tbf,
)
from schemas.nic import OFFLOAD_LONG_NAMES

# stages that cannot take a child qdisc at i:1 (every AQM is a leaf; netem, htb and tbf have one class)
LEAF_ONLY = frozenset({"pfifo", "bfifo", "red", "fq_codel", "codel", "pie", "fq_pie", "cake", "dualpi2", "fq",
                       "mark"})


class ChainError(ValueError):
    pass


def tc_handle(h: int) -> str:
    """A netlink 32-bit handle as tc prints it: "1:" for a qdisc (minor 0), "1:1" for a class."""
    return f"{h >> 16:x}:" if h & 0xFFFF == 0 else f"{h >> 16:x}:{h & 0xFFFF:x}"


def tc_time(ns: int) -> str:
    """A time for tc: whole microseconds where exact (tc's parser is microsecond-based), else fractional."""
    return f"{ns // 1000}us" if ns % 1000 == 0 else f"{ns / 1000:.3f}us"


def _opt(name: str, value: object | None, fmt=str) -> list[str]:
    return [] if value is None else [name, fmt(value)]


def _flag(on: bool | None, yes: str, no: str | None) -> list[str]:
    if on is None:
        return []
    return [yes] if on else ([no] if no else [])


def _netem(s: Netem) -> list[str]:
    argv = ["netem", "delay", tc_time(s.delay_ns)]
    if s.jitter_ns:
        argv += [tc_time(s.jitter_ns)] + (["distribution", s.distribution] if s.distribution else [])
    if s.loss:
        argv += ["loss", f"{s.loss * 100:.6g}%"]
    return argv + ["limit", str(s.limit_packets)]


# tc stores RED's max_P as probability x 2^32 in a u32: 1.0 overflows to 0 and the kernel then derives max_P
# from Plog (a 6.1 kernel reads back 0.5, tests/fixtures/tc/netem_htb_red_step_ecn.json). Cap just below 1.
RED_MAX_PROBABILITY = 0.99999999


def _red(s: Red) -> list[str]:
    p = min(s.probability, RED_MAX_PROBABILITY)
    return ["red", "limit", str(s.limit_bytes), "min", str(s.min_bytes), "max", str(s.max_bytes),
            "avpkt", str(s.avpkt_bytes), "burst", str(s.burst_packets), "probability", f"{p:.8g}",
            "bandwidth", f"{s.bandwidth_bit}bit", *_flag(s.ecn, "ecn", None), *_flag(s.adaptive, "adaptive", None),
            *_flag(s.nodrop, "nodrop", None)]


def _aqm(stage: QdiscStage) -> list[str] | None:
    """The flow-queueing and delay-based AQMs; None for other kinds. Unset fields keep tc's defaults."""
    if isinstance(stage, FqCodel):
        return ["fq_codel", *_opt("limit", stage.limit_packets), *_opt("flows", stage.flows),
                *_opt("target", stage.target_ns, tc_time), *_opt("interval", stage.interval_ns, tc_time),
                *_opt("quantum", stage.quantum_bytes), *_opt("ce_threshold", stage.ce_threshold_ns, tc_time),
                *_opt("memory_limit", stage.memory_limit_bytes), *_flag(stage.ecn, "ecn", "noecn")]
    if isinstance(stage, Codel):
        return ["codel", *_opt("limit", stage.limit_packets), *_opt("target", stage.target_ns, tc_time),
                *_opt("interval", stage.interval_ns, tc_time),
                *_opt("ce_threshold", stage.ce_threshold_ns, tc_time), *_flag(stage.ecn, "ecn", "noecn")]
    if isinstance(stage, Pie):
        return ["pie", *_opt("limit", stage.limit_packets), *_opt("target", stage.target_ns, tc_time),
                *_opt("tupdate", stage.tupdate_ns, tc_time), *_opt("alpha", stage.alpha), *_opt("beta", stage.beta),
                *_flag(stage.ecn, "ecn", "noecn"), *_flag(stage.bytemode, "bytemode", None)]
    if isinstance(stage, FqPie):
        return ["fq_pie", *_opt("limit", stage.limit_packets), *_opt("flows", stage.flows),
                *_opt("target", stage.target_ns, tc_time), *_opt("tupdate", stage.tupdate_ns, tc_time),
                *_flag(stage.ecn, "ecn", "no_ecn")]
    if isinstance(stage, Cake):
        bw = ["bandwidth", f"{stage.bandwidth_bit}bit"] if stage.bandwidth_bit else ["unlimited"]
        return ["cake", *bw, *_opt("rtt", stage.rtt_ns, tc_time), *([stage.flow_mode] if stage.flow_mode else []),
                *([stage.diffserv] if stage.diffserv else []), *_flag(stage.ack_filter, "ack-filter", "no-ack-filter"),
                *_opt("overhead", stage.overhead_bytes)]
    if isinstance(stage, DualPi2):
        return ["dualpi2", *_opt("limit", stage.limit_packets), *_opt("target", stage.target_ns, tc_time),
                *_opt("tupdate", stage.tupdate_ns, tc_time), *_opt("step_thresh", stage.step_thresh_ns, tc_time),
                *_opt("coupling_factor", stage.coupling_factor), *([stage.ecn_mask] if stage.ecn_mask else []),
                *_flag(stage.split_gso, "split_gso", "no_split_gso")]
    if isinstance(stage, Fq):
        return ["fq", *_opt("limit", stage.limit_packets), *_opt("flow_limit", stage.flow_limit_packets),
                *_opt("quantum", stage.quantum_bytes), *_opt("initial_quantum", stage.initial_quantum_bytes),
                *_opt("maxrate", stage.maxrate_bit, lambda b: f"{b}bit"), *_flag(stage.pacing, "pacing", "nopacing"),
                *_opt("ce_threshold", stage.ce_threshold_ns, tc_time)]
    return None


def stage_params(stage: QdiscStage) -> list[str]:
    if isinstance(stage, Htb):
        return ["htb", "default", "1"]
    if isinstance(stage, Tbf):
        return ["tbf", "rate", f"{stage.rate_bit}bit", "burst", str(stage.burst_bytes),
                "limit", str(stage.limit_bytes)]
    if isinstance(stage, Pfifo):
        return ["pfifo", "limit", str(stage.limit_packets)]
    if isinstance(stage, Bfifo):
        return ["bfifo", "limit", str(stage.limit_bytes)]
    if isinstance(stage, Netem):
        return _netem(stage)
    if isinstance(stage, Red):
        return _red(stage)
    aqm = _aqm(stage)
    if aqm is not None:
        return aqm
    # `mark` is tcplab's own qdisc: it needs the aqm-mark kernel variant and its patched tc
    raise ChainError(f"no argv builder for qdisc {stage.kind!r} in stock iproute2")


def htb_class_argv(dev: str, handle_major: int, stage: Htb) -> list[str]:
    argv = ["tc", "class", "add", "dev", dev, "parent", f"{handle_major}:", "classid", f"{handle_major}:1",
            "htb", "rate", f"{stage.rate_bit}bit", "ceil", f"{stage.ceil_bit or stage.rate_bit}bit"]
    if stage.burst_bytes:
        argv += ["burst", str(stage.burst_bytes)]
    if stage.cburst_bytes or stage.burst_bytes:
        argv += ["cburst", str(stage.cburst_bytes or stage.burst_bytes)]
    if stage.quantum_bytes:
        argv += ["quantum", str(stage.quantum_bytes)]
    return argv


def chain_argv(dev: str, stages: list[QdiscStage]) -> list[list[str]]:
    """Commands that build `stages` on `dev`, assuming its root was reset to the default first."""
    for i, stage in enumerate(stages[:-1]):
        if stage.kind in LEAF_ONLY:
            raise ChainError(f"stage {i} ({stage.kind}) cannot have a child qdisc; put it last")
    cmds: list[list[str]] = []
    for i, stage in enumerate(stages):
        where = ["root"] if i == 0 else ["parent", f"{i}:1"]
        cmds.append(["tc", "qdisc", "add", "dev", dev, *where, "handle", f"{i + 1}:", *stage_params(stage)])
        if stage.kind in CLASSFUL_KINDS:
            assert isinstance(stage, Htb)
            cmds.append(htb_class_argv(dev, i + 1, stage))
    return cmds


def root_delete_argv(dev: str) -> list[str]:
    return ["tc", "qdisc", "del", "dev", dev, "root"]


def offload_argv(dev: str, changes: dict[str, bool]) -> list[str]:
    argv = ["ethtool", "-K", dev]
    for name, on in sorted(changes.items()):
        if name not in OFFLOAD_LONG_NAMES:
            raise ChainError(f"unknown offload feature {name!r}")
        argv += [name, "on" if on else "off"]
    return argv


def readback_argv(dev: str) -> dict[str, list[str]]:
    return {
        "tc_qdisc": ["tc", "-s", "-d", "-j", "qdisc", "show", "dev", dev],
        "tc_class_text": ["tc", "-s", "-d", "class", "show", "dev", dev],
        "features": ["ethtool", "--json", "-k", dev],
    }
