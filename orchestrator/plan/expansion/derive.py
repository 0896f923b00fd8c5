"""Derived values of a run: numbers computed from the stated ones at expansion time and shown to the user.

Pure arithmetic in kernel units (bit/s, ns, bytes). The formulas are those of docs/guards.md: htb burst
(G-HTB), BDP, per-flow window in segments (G-FLOOR), queue capacity in time at the bottleneck,
RED thresholds from time to bytes (G-RED), the step threshold K with its 2 MTU floor and the netem
limit (G-NETEM). Thresholds written relative to the BDP or the target queue are converted per run here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.plan.expansion.runspec import Derived
from orchestrator.plan.model.frames import NS_PER_S, htb_burst_bytes, wire_frame_bytes
from orchestrator.plan.model.qdiscs import BfifoQueue, CakeQueue, MarkQueue, Queue, RedQueue
from orchestrator.plan.model.template import Bottleneck, RunTemplate
from schemas.qdiscs import KINDS

FRAME_OVERHEAD = 18  # Ethernet header + FCS: the frame of the window maths (docs/guards.md#g-floor)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def bdp_bytes(rate_bit: int, rtt_ns: int) -> int:
    """Bandwidth-delay product in bytes, rounded up."""
    return _ceil_div(rate_bit * rtt_ns, 8 * NS_PER_S)


def bytes_at_rate(rate_bit: int, time_ns: int) -> int:
    """Bytes that drain in `time_ns` at `rate_bit` (AQM thresholds written in time, docs/guards.md#g-red)."""
    return bdp_bytes(rate_bit, time_ns)


def drain_time_ns(size_bytes: int, rate_bit: int) -> int:
    """Time to send `size_bytes` at `rate_bit`, rounded up to the nanosecond."""
    return _ceil_div(size_bytes * 8 * NS_PER_S, rate_bit)


def window_segments(rate_bit: int, flows: int, mtu: int, rtt_ns: int, threshold_ns: int = 0) -> float:
    """Per-flow window in segments: W_s = rate / (N x frame x 8) x (base RTT + threshold)."""
    frame = mtu + FRAME_OVERHEAD
    return rate_bit * (rtt_ns + threshold_ns) / (flows * frame * 8 * NS_PER_S)


@dataclass(frozen=True)
class RedBytes:
    """RED parameters in kernel units (tc-red), converted from time at the bottleneck rate."""

    min_bytes: int
    max_bytes: int
    limit_bytes: int
    avpkt_bytes: int
    burst_packets: int
    probability: float


@dataclass(frozen=True)
class LinkRefs:
    """What relative values of one run are relative to: the bottleneck rate, base RTT and target queue."""

    rate_bit: int
    mtu: int
    rtt_ns: int | None
    target_ns: int | None


def run_rtt_ns(t: RunTemplate) -> int | None:
    """The stated base RTT, or the bottleneck's netem delay (then the whole RTT sits on that path)."""
    if t.base_rtt is not None:
        return t.base_rtt.value
    return t.bottleneck.delay.value if t.bottleneck is not None and t.bottleneck.delay is not None else None


def aqm_target_ns(queue: Queue, rtt_ns: int | None) -> int | None:
    """The queue delay an AQM aims for when the plan gives no `target`: its lower threshold or target
    (None when that threshold is itself relative to the target)."""
    if isinstance(queue, (RedQueue, MarkQueue)):
        return None if queue.min.value[0] == "target" else queue.min.in_ns(rtt_ns, None)
    for name in ("target", "step_thresh", "ce_threshold"):
        value = getattr(queue, name, None)
        if value is not None:
            return value.value
    return 0


def link_refs(t: RunTemplate) -> LinkRefs | None:
    b = t.bottleneck
    if b is None:
        return None
    rtt = run_rtt_ns(t)
    target = b.target.value if b.target is not None else aqm_target_ns(b.queue, rtt)
    return LinkRefs(b.rate.value, t.mtu.value, rtt, target)


def red_times(q: RedQueue, refs: LinkRefs) -> tuple[int, int | None]:
    """RED thresholds of one run in ns (raises ValueError when a relative one has no reference)."""
    return (q.min.in_ns(refs.rtt_ns, refs.target_ns),
            q.max.in_ns(refs.rtt_ns, refs.target_ns) if q.max is not None else None)


def red_bytes(q: RedQueue, refs: LinkRefs) -> RedBytes:
    """Thresholds in bytes (docs/guards.md#g-red). Step: K = max(rate x t, 2 MTU), max = K + 1."""
    rate, mtu = refs.rate_bit, refs.mtu
    lo_ns, hi_ns = red_times(q, refs)
    limit = q.limit.in_bytes(rate, refs.rtt_ns)
    if q.mode == "step":
        k = step_k_bytes(rate, lo_ns, mtu)
        avpkt = q.avpkt.value if q.avpkt else mtu
        # stock tc derives the EWMA weight from burst; the smallest burst it accepts is about min/avpkt
        burst = q.burst or k // avpkt + 1
        p = q.probability.value if q.probability is not None else 1.0
        return RedBytes(k, k + 1, limit, avpkt, burst, p)
    lo = bytes_at_rate(rate, lo_ns)
    hi = bytes_at_rate(rate, hi_ns) if hi_ns is not None else lo + 1
    if q.mode == "inst":   # a ramp on the instantaneous queue: the smallest burst, as for the step
        avpkt = q.avpkt.value if q.avpkt else mtu
        p = q.probability.value if q.probability is not None else 1.0   # run_rules requires it stated
        return RedBytes(lo, hi, limit, avpkt, q.burst or lo // avpkt + 1, p)
    avpkt = q.avpkt.value if q.avpkt else 1000
    burst = q.burst or max(1, _ceil_div(2 * lo + hi, 3 * avpkt))   # Floyd / tc-red rule of thumb
    p = q.probability.value if q.probability is not None else 0.1
    return RedBytes(lo, hi, limit, avpkt, burst, p)


def step_k_bytes(rate_bit: int, k_ns: int, mtu: int) -> int:
    """Step marking threshold K = max(rate/8 x t, 2 MTU): the floor covers serialisation on slow links."""
    return max(bytes_at_rate(rate_bit, k_ns), 2 * mtu)


def queue_capacity_bytes(queue: Queue, refs: LinkRefs) -> int | None:
    """Largest backlog the leaf can hold (None when only memory bounds it, as for CAKE); a packet-limited
    queue is counted in full frames."""
    if isinstance(queue, (BfifoQueue, RedQueue)):   # a `Buffer`: bytes, time at the rate, or BDPs
        return queue.limit.in_bytes(refs.rate_bit, refs.rtt_ns)
    if isinstance(queue, CakeQueue):
        return None
    limit = getattr(queue, "limit", None)
    packets = limit if limit is not None else KINDS[queue.kind].default_limit_packets
    return packets * wire_frame_bytes(refs.mtu)


def netem_limit_rule(rate_bit: int, delay_ns: int, mtu: int, child_packets: int) -> int:
    """G-NETEM: limit >= ceil(1.5 x rate x delay / MTU) plus the child's buffer in packets."""
    return _ceil_div(3 * rate_bit * delay_ns, 2 * 8 * NS_PER_S * mtu) + child_packets


def netem_limit_packets(b: Bottleneck, refs: LinkRefs) -> int | None:
    """The netem limit of the bottleneck: stated, or derived from the line rate; None without a delay."""
    if b.delay is None:
        return None
    if b.netem_limit is not None:
        return b.netem_limit
    line = b.line_rate.value if b.line_rate else b.rate.value   # run_rules requires line_rate here
    capacity = queue_capacity_bytes(b.queue, refs)
    child = _ceil_div(capacity, refs.mtu) if capacity is not None else 0
    return netem_limit_rule(line, b.delay.value, refs.mtu, child)


def _red_values(q: RedQueue, refs: LinkRefs, flows: int) -> dict[str, Any]:
    r = red_bytes(q, refs)
    lo_ns, hi_ns = red_times(q, refs)
    out: dict[str, Any] = {"red_min_us": lo_ns / 1000, "red_min_bytes": r.min_bytes}
    if q.mode != "step":
        out.update({"red_max_us": (hi_ns or 0) / 1000, "red_max_bytes": r.max_bytes})
    else:
        out.update({"step_k_bytes": r.min_bytes, "red_max_bytes": r.max_bytes})
    out.update({"red_limit_bytes": r.limit_bytes, "red_avpkt_bytes": r.avpkt_bytes,
                "red_burst_packets": r.burst_packets, "red_probability": r.probability})
    if refs.rtt_ns is not None:
        w = window_segments(refs.rate_bit, flows, refs.mtu, refs.rtt_ns, lo_ns)
        out["window_segments_at_min"] = round(w, 3)
        if q.mode != "step" and hi_ns is not None:
            w = window_segments(refs.rate_bit, flows, refs.mtu, refs.rtt_ns, hi_ns)
            out["window_segments_at_max"] = round(w, 3)
    return out


def tcp_flow_count(t: RunTemplate) -> int:
    """Flows that share the bottleneck as TCP (UDP load is not a window-limited flow)."""
    return sum(g.flows for g in [t.traffic, *t.background] if g.tool != "udp")


def derived_values(t: RunTemplate) -> Derived:
    """Derived values of an instantiated run template."""
    return Derived(**_derived_dict(t))


def _derived_dict(t: RunTemplate) -> dict[str, Any]:
    mtu = t.mtu.value
    out: dict[str, Any] = {"wire_frame_bytes": wire_frame_bytes(mtu)}
    b, refs = t.bottleneck, link_refs(t)
    if b is None or refs is None:
        return out
    rate, rtt, flows = refs.rate_bit, refs.rtt_ns, max(1, tcp_flow_count(t))
    out["bottleneck_rate_bit"] = rate
    if b.line_rate is not None:
        out["line_rate_bit"] = b.line_rate.value
    out["htb_burst_bytes"] = b.burst.value if b.burst else htb_burst_bytes(rate, mtu)
    capacity = queue_capacity_bytes(b.queue, refs)
    if capacity is not None:
        out["queue_capacity_bytes"] = capacity
        out["queue_capacity_ms"] = round(drain_time_ns(capacity, rate) / 1e6, 3)
    if b.delay is not None:
        out["netem_limit_packets"] = netem_limit_packets(b, refs)
        if b.line_rate is not None:
            child = _ceil_div(capacity, mtu) if capacity is not None else 0
            rule = netem_limit_rule(b.line_rate.value, b.delay.value, mtu, child)
            out["netem_limit_rule_packets"] = rule
            out["netem_limit_below_rule"] = out["netem_limit_packets"] < rule
    if isinstance(b.queue, RedQueue):
        out.update(_red_values(b.queue, refs, flows))
        if b.queue.ecn:   # marking, not dropping: the flows' queue tops out at the upper threshold
            out["marking_queue_bytes"] = out["red_max_bytes"]
    elif isinstance(b.queue, MarkQueue):
        top = b.queue.max if b.queue.max is not None else b.queue.min
        out["marking_queue_bytes"] = step_k_bytes(rate, top.in_ns(rtt, refs.target_ns), mtu)
        if b.queue.mode == "step":
            out["step_k_bytes"] = out["marking_queue_bytes"]
    target = refs.target_ns or 0
    out["target_us"] = target / 1000
    if rtt is not None:
        out["base_rtt_us"] = rtt / 1000
        bdp = bdp_bytes(rate, rtt)
        out["bdp_bytes"] = bdp
        if capacity is not None:
            out["queue_capacity_bdp"] = round(capacity / max(1, bdp), 3)
        w = window_segments(rate, flows, mtu, rtt, target)
        out["per_flow_window_segments"] = round(w, 3)
        out["submss"] = w < 2   # G-FLOOR: the cwnd cannot go below 2 segments per flow
        # G-FLOOR: with every flow at 2 segments the queue cannot drain below N x 2 frames - BDP
        floor_ns = flows * 2 * (mtu + FRAME_OVERHEAD) * 8 * NS_PER_S // rate - rtt
        out["floor_queue_us"] = round(max(0, floor_ns) / 1000, 1)
    return out
