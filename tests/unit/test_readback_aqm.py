"""Read-back of AQM and delay stages, on literal `tc -s -d -j qdisc show` output captured in the VM lab
from a Debian 6.1 kernel (tests/fixtures/tc/, see its README)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.qdiscs import Cake, Codel, Fq, FqCodel, FqPie, Netem, Pie, Red, option_differences

TC = Path(__file__).resolve().parents[1] / "fixtures" / "tc"


def qdisc(name: str, kind: str) -> dict:
    """The qdisc's object in a literal `tc -s -d -j qdisc show`."""
    return next(q for q in json.loads((TC / f"{name}.json").read_text()) if q["kind"] == kind)


RAMP = Red(limit_bytes=500_000, min_bytes=25_000, max_bytes=75_000, avpkt_bytes=1000, burst_packets=42,
           probability=0.1, bandwidth_bit=20_000_000, ecn=True, adaptive=True)


@pytest.mark.parametrize(("name", "kind", "stage"), [
    ("netem_htb_red_ecn", "netem", Netem(delay_ns=10_000_000, limit_packets=1000)),
    ("netem_htb_red_ecn", "red", RAMP),
    ("netem_jitter_loss", "netem", Netem(delay_ns=5_000_000, jitter_ns=1_000_000, distribution="normal", loss=0.01,
                                         limit_packets=2000)),
    ("netem_500us_uml", "netem", Netem(delay_ns=500_000, limit_packets=1000)),     # reads back 0.000499 s
    ("netem_100us_jitter_uml", "netem", Netem(delay_ns=100_000, jitter_ns=20_000, limit_packets=1000)),
    ("htb_fq_codel", "fq_codel", FqCodel(limit_packets=10240, target_ns=5_000_000, interval_ns=100_000_000)),
    ("htb_codel", "codel", Codel(target_ns=5_000_000, interval_ns=100_000_000)),
    ("htb_pie_ecn", "pie", Pie(limit_packets=1000, target_ns=15_000_000, ecn=True)),
    ("htb_fq_pie", "fq_pie", FqPie(limit_packets=10240, ecn=False)),   # fq_pie's default: no ECN
    ("fq_maxrate", "fq", Fq(maxrate_bit=50_000_000)),
    ("htb_cake", "cake", Cake(bandwidth_bit=20_000_000)),
    ("htb_cake", "cake", Cake(bandwidth_bit=20_000_000, rtt_ns=100_000_000, flow_mode="triple-isolate",
                              diffserv="diffserv3", overhead_bytes=0)),
])
def test_what_was_applied_reads_back_equal(name: str, kind: str, stage: object) -> None:
    assert option_differences(stage, qdisc(name, kind)) == []


def test_mismatches_are_named() -> None:
    wrong = RAMP.model_copy(update={"max_bytes": 80_000, "adaptive": False})
    assert option_differences(wrong, qdisc("netem_htb_red_ecn", "red")) == [
        "max 75000 != 80000", "adaptive True != False"]
    assert option_differences(Netem(delay_ns=20_000_000, limit_packets=1000),
                                  qdisc("netem_htb_red_ecn", "netem")) == ["delay 0.01 != 0.02"]
    cake = Cake(bandwidth_bit=10_000_000, rtt_ns=20_000_000, flow_mode="flows", diffserv="besteffort",
                ack_filter=True)
    assert option_differences(cake, qdisc("htb_cake", "cake")) == [
        "bandwidth 2500000 != 1250000", "rtt 100000 != 20000", "flowmode triple-isolate != flows",
        "diffserv diffserv3 != besteffort", "ack-filter disabled != enabled"]


def test_red_probability_one_does_not_survive_tc() -> None:
    # `probability 1.0` overflows tc's u32 max_P; the kernel falls back to a Plog-derived value (0.5 here).
    # The read-back catches it, which is why the argv builder caps the probability just below 1.
    step = Red(limit_bytes=500_000, min_bytes=3000, max_bytes=3001, avpkt_bytes=1000, burst_packets=4,
               probability=1.0, bandwidth_bit=20_000_000, ecn=True)
    assert option_differences(step, qdisc("netem_htb_red_step_ecn", "red")) == ["probability 0.5 != 1.0"]


def test_a_netem_time_is_held_to_what_tc_can_express_and_no_further():
    """500 µs reads back as 0.000499 s: one µs lost in tc's tick conversion, a float difference of 1e-6 + 1e-15
    that a bound of exactly 1 µs refused. Off by more than 2 µs (or 0.1 %) is still a difference."""
    got = qdisc("netem_500us_uml", "netem")
    assert option_differences(Netem(delay_ns=503_000, limit_packets=1000), got) == ["delay 0.000499 != 0.000503"]
    assert option_differences(Netem(delay_ns=501_000, limit_packets=1000), got) == []
