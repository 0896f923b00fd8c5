"""Frame sizes the model's defaults and rules are counted in (pure arithmetic, kernel units).

A full-size packet occupies MTU + 14 bytes in the accounting of htb and tc (the IP packet plus the
Ethernet header; no FCS, no preamble), and the htb burst default is rate x 1 ms, never below one such
frame (G-HTB). Both are model rules: a qdisc stage's default burst and the "burst smaller than one frame"
check use them, and the expansion reports them as derived values.
"""
from __future__ import annotations

ETH_HEADER = 14     # bytes htb and tc count per packet on top of the IP packet (no FCS, no preamble)
NS_PER_S = 10**9
HTB_BURST_TIME_NS = 10**6  # G-HTB: start at >= rate x 1 ms of burst


def wire_frame_bytes(mtu: int) -> int:
    """Bytes a full-size packet occupies in the qdisc's accounting (IP packet + Ethernet header)."""
    return mtu + ETH_HEADER


def htb_burst_bytes(rate_bit: int, mtu: int, burst_time_ns: int = HTB_BURST_TIME_NS) -> int:
    """htb burst: rate x 1 ms / 8, but never below one full frame (tc's own default is about one MTU)."""
    return max(-(-(rate_bit * burst_time_ns) // (8 * NS_PER_S)), wire_frame_bytes(mtu))
