"""The `aqm_mark` qdisc's netlink options (experiments/modules/sch_aqm_mark), as pure functions on bytes.

TCA_OPTIONS of an RTM_NEWQDISC with TCA_KIND "aqm_mark" is a nest of these attributes (host byte order;
the dump adds TCA_AQM_MARK_PAD before u64s for alignment, which decoding skips):

    1 MODE        u32  0 step, 1 ramp
    2 METRIC      u32  0 sojourn, 1 est
    3 MIN_NS      u64  step threshold / ramp lower end
    4 MAX_NS      u64  ramp upper end (probability 1); step: ignored
    5 LIMIT       u32  packets
    6 ON_DEQUEUE  u8   1 decide at dequeue, 0 at enqueue
    7 RATE        u64  bytes/s for est; 0: the measured drain rate
    8 PAD

TCA_XSTATS is struct tc_aqm_mark_xstats: five u64 (packets, marked, dropped, not_ect, drain_rate).
No patched tc is needed: anything that sends raw TCA_OPTIONS (pyroute2, orchestrator/kernel/mark_nl.py) can
configure it. Docs: docs/modules.md.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from schemas.qdiscs import nla

if TYPE_CHECKING:   # mark.py builds its kind from the encoder below
    from schemas.qdiscs.mark import Mark

KIND = "aqm_mark"
MODE, METRIC, MIN_NS, MAX_NS, LIMIT, ON_DEQUEUE, RATE, PAD = range(1, 9)
MODES = {"step": 0, "ramp": 1}
METRICS = {"sojourn": 0, "est": 1}
_FORMATS = {MODE: "=I", METRIC: "=I", MIN_NS: "=Q", MAX_NS: "=Q", LIMIT: "=I", ON_DEQUEUE: "=B", RATE: "=Q"}
_NAMES = {MODE: "mode", METRIC: "metric", MIN_NS: "min_ns", MAX_NS: "max_ns", LIMIT: "limit_packets",
          ON_DEQUEUE: "on_dequeue", RATE: "rate_bytes_ps"}
XSTATS_FIELDS = ("packets", "marked", "dropped", "not_ect", "drain_rate")
_XSTATS = struct.Struct("=5Q")


class MarkNetlinkError(ValueError):
    pass


def encode_options(mode: str, metric: str, min_ns: int, max_ns: int | None, limit_packets: int,
                   on_dequeue: bool = True, rate_bytes_ps: int = 0) -> bytes:
    """The TCA_OPTIONS payload (the nested attributes, without the TCA_OPTIONS header)."""
    if mode not in MODES or metric not in METRICS:
        raise MarkNetlinkError(f"mode {mode!r} / metric {metric!r}: expected {sorted(MODES)} / {sorted(METRICS)}")
    if mode == "ramp" and (max_ns is None or max_ns <= min_ns):
        raise MarkNetlinkError("ramp needs max_ns > min_ns")
    values = {MODE: MODES[mode], METRIC: METRICS[metric], MIN_NS: min_ns, MAX_NS: max_ns or 0,
              LIMIT: limit_packets, ON_DEQUEUE: int(on_dequeue), RATE: rate_bytes_ps}
    return b"".join(nla.attr(k, struct.pack(_FORMATS[k], v)) for k, v in values.items())


def options_for(stage: Mark, rate_bytes_ps: int = 0) -> bytes:
    """TCA_OPTIONS payload for a plan's `mark` stage (schemas.qdiscs.mark.Mark)."""
    return encode_options(stage.mode, stage.metric, stage.min_ns, stage.max_ns, stage.limit_packets,
                          stage.on_dequeue, rate_bytes_ps)


def decode_options(data: bytes) -> dict:
    """The TCA_OPTIONS payload of a dump -> {mode, metric, min_ns, max_ns, limit_packets, on_dequeue,
    rate_bytes_ps}; PAD and unknown attributes are skipped."""
    out = nla.decode(data, _FORMATS, _NAMES, MarkNetlinkError)
    if "mode" in out:
        out["mode"] = {v: k for k, v in MODES.items()}.get(out["mode"], out["mode"])
    if "metric" in out:
        out["metric"] = {v: k for k, v in METRICS.items()}.get(out["metric"], out["metric"])
    if "on_dequeue" in out:
        out["on_dequeue"] = bool(out["on_dequeue"])
    return out


def decode_xstats(data: bytes) -> dict:
    if len(data) < _XSTATS.size:
        raise MarkNetlinkError(f"xstats: {len(data)} bytes, expected {_XSTATS.size}")
    return dict(zip(XSTATS_FIELDS, _XSTATS.unpack_from(data), strict=True))


def from_hex(text: str | bytes) -> bytes:
    """pyroute2 shows attributes it has no decoder for as "08:00:01:00"; bytes pass through."""
    return text if isinstance(text, bytes) else bytes.fromhex(text.replace(":", ""))
