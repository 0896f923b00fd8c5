"""RED (tc-red): thresholds in bytes, already converted from time at the bottleneck rate by the plan.

tc derives two kernel parameters from avpkt, burst and bandwidth and prints only those: the EWMA weight
log (`ewma`, from min, burst and avpkt) and the idle-time cell log (`Scell_log`, from that weight, avpkt
and the bandwidth). The read-back recomputes both the way tc does, so those three options are verified too.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import Expect, QdiscKind, Strict, bits, bytes_in_packets, flag, tc_rounded


class Red(Strict):
    """RED with thresholds already converted to bytes at the bottleneck rate (tc-red parameters)."""

    kind: Literal["red"] = "red"
    limit_bytes: int = Field(gt=0, description="hard queue limit, bytes")
    min_bytes: int = Field(gt=0, description="lower marking threshold, bytes")
    max_bytes: int = Field(gt=0, description="upper marking threshold, bytes (> min)")
    avpkt_bytes: int = Field(gt=0, description="average packet size, bytes")
    burst_packets: int = Field(gt=0, description="burst allowance; sets the EWMA weight")
    probability: float = Field(gt=0, le=1, description="marking probability at max")
    bandwidth_bit: int = Field(gt=0, description="link rate for idle-time averaging, bit/s")
    ecn: bool = Field(default=False, description="mark ECT packets instead of dropping")
    adaptive: bool = Field(default=False, description="adapt max_p (adaptive RED)")
    nodrop: bool = Field(default=False, description="with ecn: queue non-ECT packets instead of dropping them")


# tc stores RED's max_P as probability x 2^32 in a u32: 1.0 overflows to 0 and the kernel then derives max_P
# from Plog (a 6.1 kernel reads back 0.5, tests/fixtures/tc/netem_htb_red_step_ecn.json). Cap just below 1.
RED_MAX_PROBABILITY = 0.99999999

# psched ticks per µs as tc computes it from /proc/net/psched (1000 / 64 on every high-resolution-timer
# kernel: "000003e8 00000040 000f4240 3b9aca00")
TICKS_PER_US = 1000 / 64


def params(s: Red) -> list[str]:
    p = min(s.probability, RED_MAX_PROBABILITY)
    return ["red", "limit", str(s.limit_bytes), "min", str(s.min_bytes), "max", str(s.max_bytes),
            "avpkt", str(s.avpkt_bytes), "burst", str(s.burst_packets), "probability", f"{p:.8g}",
            "bandwidth", bits(s.bandwidth_bit), *flag(s.ecn, "ecn", None), *flag(s.adaptive, "adaptive", None),
            *flag(s.nodrop, "nodrop", None)]


def ewma_log(min_bytes: int, burst: int, avpkt: int) -> int | None:
    """The smallest W = 2^-wlog for which a burst of `burst` packets arriving at an empty queue lifts the
    average to min: burst + 1 - min/avpkt <= (1 - (1 - W)^burst) / W (tc-red's rule; None: burst too small)."""
    need = burst + 1 - min_bytes / avpkt
    if need < 1.0:
        return None
    weight = 0.5
    for wlog in range(1, 32):
        if need <= (1 - (1 - weight) ** burst) / weight:
            return wlog
        weight /= 2
    return None


def idle_cell_log(wlog: int, avpkt: int, bandwidth_bit: int) -> int | None:
    """The cell log of RED's idle-time table: the smallest c with (31 / l) / 2^c < 512, where l is the
    per-tick decay of the average while the queue is idle (one avpkt per transmission time)."""
    # tc truncates twice: the transmission time to whole µs, then its ticks to a whole number
    xmit_ticks = math.floor(math.floor(10**6 * avpkt / (bandwidth_bit // 8)) * TICKS_PER_US)
    if xmit_ticks == 0:   # under 1 µs per packet (> ~8 Gbit/s at 1000 B): tc's decay is infinite, its cell log 0
        return 0
    decay = -math.log(1.0 - 1.0 / (1 << wlog)) / xmit_ticks
    for clog in range(32):
        if (31 / decay) / (1 << clog) < 512:
            return clog
    return None


def expected(s: Red) -> list[Expect]:
    wlog = ewma_log(s.min_bytes, s.burst_packets, s.avpkt_bytes)
    cell = idle_cell_log(wlog, s.avpkt_bytes, s.bandwidth_bit) if wlog is not None else None
    return [Expect("limit", ("options", "limit"), s.limit_bytes, ("limit_bytes",)),
            Expect("min", ("options", "min"), s.min_bytes, ("min_bytes",)),
            Expect("max", ("options", "max"), s.max_bytes, ("max_bytes",)),
            Expect("ecn", ("options", "ecn"), s.ecn, ("ecn",)),
            Expect("adaptive", ("options", "adaptive"), s.adaptive, ("adaptive",)),
            Expect("nodrop", ("options", "nodrop"), s.nodrop, ("nodrop",)),
            Expect("probability", ("options", "probability"), s.probability, ("probability",), tc_rounded),
            Expect("ewma", ("options", "ewma"), wlog, ("burst_packets", "avpkt_bytes", "min_bytes"),
                   why=f"tc's weight log for burst {s.burst_packets}, avpkt {s.avpkt_bytes}, min {s.min_bytes}"),
            Expect("Scell_log", ("options", "Scell_log"), cell, ("bandwidth_bit", "avpkt_bytes"),
                   why=f"tc's idle cell log for bandwidth {s.bandwidth_bit} bit/s, avpkt {s.avpkt_bytes}")]


RED = QdiscKind(
    stage=Red,
    params=params,
    expected=expected,
    buffer_packets=lambda s, mtu: bytes_in_packets(s.limit_bytes, mtu),
    probe=("red", "limit", "400000", "min", "30000", "max", "90000", "avpkt", "1000", "burst", "55",
           "bandwidth", "10mbit", "probability", "0.1"),
    leaf_only=True,
)
