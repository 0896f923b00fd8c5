"""DualPI2's netlink options and xstats as pure functions on bytes (no patched tc: iproute2 6.1 does not know
the qdisc; anything that sends raw TCA_OPTIONS can configure it, orchestrator/kernel/dualpi2_nl.py).

Attribute numbers and types are those of include/uapi/linux/pkt_sched.h in Linux 7.2 (linux-source-7.2,
`enum { TCA_DUALPI2_UNSPEC, ... }`, `struct tc_dualpi2_xstats`), types as net/sched/sch_dualpi2.c's
dualpi2_policy and dualpi2_dump put them (host byte order):

     1 LIMIT             u32  packets
     2 MEMORY_LIMIT      u32  bytes
     3 TARGET            u32  µs, the classic queue's delay target (default 15 ms)
     4 TUPDATE           u32  µs, the PI update interval (default 16 ms)
     5 ALPHA             u32  Hz scaled by 256 (default 41)
     6 BETA              u32  Hz scaled by 256 (default 819)
     7 STEP_THRESH_PKTS  u32  L queue step threshold in packets   } one of the two; a dump carries the
     8 STEP_THRESH_US    u32  L queue step threshold in µs         } one in use (default 1000 µs)
     9 MIN_QLEN_STEP     u32  packets in L before the step applies (default 0)
    10 COUPLING          u8   k (default 2): p_L = k·p', p_C = p'²
    11 DROP_OVERLOAD     u8   0 overflow, 1 drop (default)
    12 DROP_EARLY        u8   0 drop at dequeue (default), 1 at enqueue
    13 C_PROTECTION      u8   classic queue's WRR weight, % (default 10)
    14 ECN_MASK          u8   1 l4s_ect (ECT(1), default), 2 cla_ect, 3 any_ect
    15 SPLIT_GSO         u8   0 no, 1 split (default)
    16 PAD

TCA_XSTATS is struct tc_dualpi2_xstats: u32 prob (p' scaled to 2^32 - 1), delay_c, delay_l (µs, the heads'
current sojourn), packets_in_c, packets_in_l, maxq, ecn_mark (every CE mark), step_marks (the L queue's step
marks among them), s32 credit, u32 memory_used, max_memory_used, memory_limit.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from schemas.qdiscs import nla

if TYPE_CHECKING:   # dualpi2.py builds its kind from the encoder below
    from schemas.qdiscs.dualpi2 import DualPi2

KIND = "dualpi2"
(LIMIT, MEMORY_LIMIT, TARGET, TUPDATE, ALPHA, BETA, STEP_THRESH_PKTS, STEP_THRESH_US, MIN_QLEN_STEP, COUPLING,
 DROP_OVERLOAD, DROP_EARLY, C_PROTECTION, ECN_MASK, SPLIT_GSO, PAD) = range(1, 17)
_U8 = {COUPLING, DROP_OVERLOAD, DROP_EARLY, C_PROTECTION, ECN_MASK, SPLIT_GSO}
NAMES = {LIMIT: "limit_packets", MEMORY_LIMIT: "memory_limit_bytes", TARGET: "target_us", TUPDATE: "tupdate_us",
         ALPHA: "alpha", BETA: "beta", STEP_THRESH_PKTS: "step_thresh_packets", STEP_THRESH_US: "step_thresh_us",
         MIN_QLEN_STEP: "min_qlen_step", COUPLING: "coupling_factor", DROP_OVERLOAD: "drop_overload",
         DROP_EARLY: "drop_early", C_PROTECTION: "c_protection_pct", ECN_MASK: "ecn_mask", SPLIT_GSO: "split_gso"}
_FORMATS = {kind: "=B" if kind in _U8 else "=I" for kind in NAMES}
ECN_MASKS = {"l4s_ect": 1, "cla_ect": 2, "any_ect": 3}
MAX_PROB = 0xFFFFFFFF
XSTATS_FIELDS = ("prob", "delay_c_us", "delay_l_us", "packets_in_c", "packets_in_l", "maxq", "ecn_mark",
                 "step_marks", "credit", "memory_used", "max_memory_used", "memory_limit")
_XSTATS = struct.Struct("=8Ii3I")


class Dualpi2NetlinkError(ValueError):
    pass


def _us(ns: int, name: str) -> int:
    if ns % 1000:
        raise Dualpi2NetlinkError(f"{name}: {ns} ns is not a whole number of µs (the kernel takes µs)")
    return ns // 1000


def encode(values: dict[int, int]) -> bytes:
    """TCA_OPTIONS payload (the nested attributes, without the TCA_OPTIONS header) from {attribute: value}."""
    if STEP_THRESH_PKTS in values and STEP_THRESH_US in values:
        raise Dualpi2NetlinkError("step threshold in packets and in µs: the kernel takes one")
    out = b""
    for kind in sorted(values):
        if kind not in NAMES:
            raise Dualpi2NetlinkError(f"unknown dualpi2 attribute {kind}")
        out += nla.attr(kind, struct.pack(_FORMATS[kind], values[kind]))
    return out


def values_for(stage: DualPi2) -> dict[int, int]:
    """{attribute: value} for a plan's `dualpi2` stage (schemas.qdiscs.dualpi2.DualPi2); unset fields are left
    out (the kernel keeps its default)."""
    v: dict[int, int] = {}
    if stage.limit_packets is not None:
        v[LIMIT] = stage.limit_packets
    if stage.target_ns is not None:
        v[TARGET] = _us(stage.target_ns, "target_ns")
    if stage.tupdate_ns is not None:
        v[TUPDATE] = _us(stage.tupdate_ns, "tupdate_ns")
    if stage.alpha is not None:
        v[ALPHA] = stage.alpha
    if stage.beta is not None:
        v[BETA] = stage.beta
    if stage.step_thresh_ns is not None:
        v[STEP_THRESH_US] = _us(stage.step_thresh_ns, "step_thresh_ns")
    if stage.coupling_factor is not None:
        if stage.coupling_factor > 255:
            raise Dualpi2NetlinkError(f"coupling_factor {stage.coupling_factor}: the kernel takes a u8")
        v[COUPLING] = stage.coupling_factor
    if stage.ecn_mask is not None:
        v[ECN_MASK] = ECN_MASKS[stage.ecn_mask]
    if stage.split_gso is not None:
        v[SPLIT_GSO] = int(stage.split_gso)
    return v


def options_for(stage: DualPi2) -> bytes:
    return encode(values_for(stage))


def decode_options(data: bytes) -> dict:
    """The TCA_OPTIONS payload of a dump -> {name: value} (NAMES; ecn_mask by name, the u8 flags as bools);
    PAD and unknown attributes are skipped."""
    out = nla.decode(data, _FORMATS, NAMES, Dualpi2NetlinkError)
    if "ecn_mask" in out:
        out["ecn_mask"] = {v: k for k, v in ECN_MASKS.items()}.get(out["ecn_mask"], out["ecn_mask"])
    for flag in ("drop_overload", "drop_early", "split_gso"):
        if flag in out:
            out[flag] = bool(out[flag])
    return out


def alpha_beta_roundtrip(value: int) -> int:
    """What a dump shows for an ALPHA/BETA sent as `value`: sch_dualpi2.c keeps them as
    value * MAX_PROB >> 2 / NSEC_PER_SEC (dualpi2_scale_alpha_beta) and dumps the inverse (_unscale), both
    rounding down -- the default 41 reads back as 40, 819 as 818."""
    return ((((value * MAX_PROB) >> 2) // 1_000_000_000) * 1_000_000_000 << 2) // MAX_PROB


def kernel_holds(kind: int, value: int) -> int:
    """The value a dump shows for attribute `kind` sent as `value`: ALPHA/BETA round (alpha_beta_roundtrip);
    TUPDATE and STEP_THRESH_US are kept in a u32 of ns (convert_us_to_nsec saturates at 2^32 - 1 ns)."""
    if kind in (ALPHA, BETA):
        return alpha_beta_roundtrip(value)
    if kind in (TUPDATE, STEP_THRESH_US):
        return min(value * 1000, 0xFFFFFFFF) // 1000
    return value


def held(asked: dict[int, int]) -> dict:
    """What a dump (decode_options' names and types) shows for what was sent (encode's {attribute: value}):
    each attribute as the kernel keeps it (kernel_holds)."""
    return decode_options(encode({k: kernel_holds(k, v) for k, v in asked.items()}))


def held_options(stage: DualPi2) -> dict:
    """What the kernel's dump shows for a plan's stage: every attribute the stage sets, as the kernel keeps it."""
    return held(values_for(stage))


def readback_mismatches(asked: dict[int, int], shown: dict) -> list[str]:
    """What a dump (decode_options) says differently from what the kernel should hold for what was sent
    (encode's {attribute: value}, through kernel_holds)."""
    expected = held(asked)
    return [f"{name}: asked {want!r}, kernel has {shown.get(name)!r}" for name, want in expected.items()
            if shown.get(name) != want]


def decode_xstats(data: bytes) -> dict:
    """struct tc_dualpi2_xstats -> {XSTATS_FIELDS..., "p_prime": prob as a fraction}."""
    if len(data) < _XSTATS.size:
        raise Dualpi2NetlinkError(f"xstats: {len(data)} bytes, expected {_XSTATS.size}")
    out = dict(zip(XSTATS_FIELDS, _XSTATS.unpack_from(data), strict=True))
    out["p_prime"] = out["prob"] / MAX_PROB
    return out
