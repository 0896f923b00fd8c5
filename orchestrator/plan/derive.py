"""Derived values of a run: numbers computed from the stated ones at expansion time and shown to the user.

Pure arithmetic in kernel units (bit/s, ns, bytes). The formulas follow EXPERIMENTS.md: htb burst
(G-HTB), BDP, per-flow window in segments (§1.5, G-FLOOR), queue capacity in time at the bottleneck,
RED thresholds from time to bytes (§1.3, G-RED) and the netem limit (G-NETEM).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.plan.template import BfifoQueue, Bottleneck, PfifoQueue, Queue, RedQueue, RunTemplate

ETH_HEADER = 14     # bytes htb and tc count per packet on top of the IP packet (no FCS, no preamble)
FRAME_OVERHEAD = 18  # Ethernet header + FCS: EXPERIMENTS.md's frame_B = MTU + 18 for window maths
NS_PER_S = 10**9
HTB_BURST_TIME_NS = 10**6  # G-HTB: start at >= rate x 1 ms of burst


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def wire_frame_bytes(mtu: int) -> int:
    """Bytes a full-size packet occupies in the qdisc's accounting (IP packet + Ethernet header)."""
    return mtu + ETH_HEADER


def htb_burst_bytes(rate_bit: int, mtu: int, burst_time_ns: int = HTB_BURST_TIME_NS) -> int:
    """htb burst: rate x 1 ms / 8, but never below one full frame (tc's own default is about one MTU)."""
    return max(_ceil_div(rate_bit * burst_time_ns, 8 * NS_PER_S), wire_frame_bytes(mtu))


def bdp_bytes(rate_bit: int, rtt_ns: int) -> int:
    """Bandwidth-delay product in bytes, rounded up."""
    return _ceil_div(rate_bit * rtt_ns, 8 * NS_PER_S)


def bytes_at_rate(rate_bit: int, time_ns: int) -> int:
    """Bytes that drain in `time_ns` at `rate_bit` (AQM thresholds written in time, EXPERIMENTS.md)."""
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


def red_bytes(q: RedQueue, rate_bit: int, mtu: int) -> RedBytes:
    """Thresholds in bytes (EXPERIMENTS.md §1.3, G-RED). Step: K = max(rate x t, 2 MTU), max = K + 1."""
    limit = bytes_at_rate(rate_bit, q.limit.value)
    if q.mode == "step":
        k = max(bytes_at_rate(rate_bit, q.min.value), 2 * mtu)
        avpkt = q.avpkt.value if q.avpkt else mtu
        # stock tc derives the EWMA weight from burst; the smallest burst it accepts is about min/avpkt
        burst = q.burst or k // avpkt + 1
        p = q.probability.value if q.probability is not None else 1.0
        return RedBytes(k, k + 1, limit, avpkt, burst, p)
    lo = bytes_at_rate(rate_bit, q.min.value)
    hi = bytes_at_rate(rate_bit, q.max.value) if q.max else lo + 1
    avpkt = q.avpkt.value if q.avpkt else 1000
    burst = q.burst or max(1, _ceil_div(2 * lo + hi, 3 * avpkt))   # Floyd / tc-red rule of thumb
    p = q.probability.value if q.probability is not None else 0.1
    return RedBytes(lo, hi, limit, avpkt, burst, p)


def queue_capacity_bytes(queue: Queue, rate_bit: int, mtu: int) -> int:
    """Largest backlog the leaf can hold; a packet-limited queue is counted in full frames."""
    if isinstance(queue, PfifoQueue):
        return queue.limit * wire_frame_bytes(mtu)
    if isinstance(queue, BfifoQueue):
        return queue.limit.value
    return red_bytes(queue, rate_bit, mtu).limit_bytes


def netem_limit_rule(rate_bit: int, delay_ns: int, mtu: int, child_packets: int) -> int:
    """G-NETEM: limit >= ceil(1.5 x rate x delay / MTU) plus the child's buffer in packets."""
    return _ceil_div(3 * rate_bit * delay_ns, 2 * 8 * NS_PER_S * mtu) + child_packets


def netem_limit_packets(b: Bottleneck, mtu: int) -> int | None:
    """The netem limit of the bottleneck: stated, or derived from the line rate; None without a delay."""
    if b.delay is None:
        return None
    if b.netem_limit is not None:
        return b.netem_limit
    line = b.line_rate.value if b.line_rate else b.rate.value   # checks.py requires line_rate here
    child = _ceil_div(queue_capacity_bytes(b.queue, b.rate.value, mtu), mtu)
    return netem_limit_rule(line, b.delay.value, mtu, child)


def _red_values(q: RedQueue, rate: int, mtu: int, flows: int, rtt: int | None) -> dict[str, Any]:
    r = red_bytes(q, rate, mtu)
    out: dict[str, Any] = {"red_min_bytes": r.min_bytes, "red_max_bytes": r.max_bytes,
                           "red_limit_bytes": r.limit_bytes, "red_avpkt_bytes": r.avpkt_bytes,
                           "red_burst_packets": r.burst_packets, "red_probability": r.probability}
    if rtt is not None:
        out["window_segments_at_min"] = round(window_segments(rate, flows, mtu, rtt, q.min.value), 3)
        if q.mode == "ramp" and q.max is not None:
            out["window_segments_at_max"] = round(window_segments(rate, flows, mtu, rtt, q.max.value), 3)
    return out


def derived_values(t: RunTemplate) -> dict[str, Any]:
    """Derived values of a resolved run template (keys carry their unit)."""
    mtu = t.mtu.value
    out: dict[str, Any] = {"wire_frame_bytes": wire_frame_bytes(mtu)}
    b = t.bottleneck
    if b is None:
        return out
    rate = b.rate.value
    # with a netem delay on the bottleneck and no stated base RTT, the delay is the base RTT
    rtt = t.base_rtt.value if t.base_rtt is not None else (b.delay.value if b.delay is not None else None)
    out["htb_burst_bytes"] = b.burst.value if b.burst else htb_burst_bytes(rate, mtu)
    capacity = queue_capacity_bytes(b.queue, rate, mtu)
    out["queue_capacity_bytes"] = capacity
    out["queue_capacity_ms"] = round(drain_time_ns(capacity, rate) / 1e6, 3)
    if b.delay is not None:
        out["netem_limit_packets"] = netem_limit_packets(b, mtu)
        if b.line_rate is not None:
            child = _ceil_div(capacity, mtu)
            rule = netem_limit_rule(b.line_rate.value, b.delay.value, mtu, child)
            out["netem_limit_rule_packets"] = rule
            out["netem_limit_below_rule"] = out["netem_limit_packets"] < rule
    if isinstance(b.queue, RedQueue):
        out.update(_red_values(b.queue, rate, mtu, t.traffic.flows, rtt))
    if rtt is not None:
        out["bdp_bytes"] = bdp_bytes(rate, rtt)
        out["queue_capacity_bdp"] = round(capacity / max(1, bdp_bytes(rate, rtt)), 3)
        w = window_segments(rate, t.traffic.flows, mtu, rtt)
        out["window_segments_per_flow"] = round(w, 3)
        out["window_below_2_segments"] = w < 2   # G-FLOOR: cwnd cannot go below 2 segments
    return out
