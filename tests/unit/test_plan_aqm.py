"""RED and netem in plans: thresholds written in time become bytes at the bottleneck rate (G-RED), the
netem limit follows the G-NETEM rule, and impossible settings are refused where they were written."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan import PlanError, expand, load_plan, load_plan_text
from schemas.hoststate import Htb, Netem, Red

PLANS = Path(__file__).resolve().parents[1] / "plans"


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], object]:
    return {(r.params["arm"], r.params["min"]): r for r in expand(load_plan(PLANS / "good_red_netem.yaml"))}


def test_ramp_chain_in_kernel_units(runs: dict) -> None:
    r = runs[("reno-ramp", "500us")]
    netem, htb, red = r.hosts["aqm"].qdiscs["client"]
    # 200 Mbit/s: 500 us = 12500 B, 1500 us = 37500 B, buffer 200 ms = 5 MB; burst = (2 min + max) / 3 avpkt
    assert red == Red(limit_bytes=5_000_000, min_bytes=12_500, max_bytes=37_500, avpkt_bytes=1000,
                      burst_packets=21, probability=0.1, bandwidth_bit=200_000_000, ecn=True, adaptive=True)
    assert htb == Htb(rate_bit=200_000_000, ceil_bit=200_000_000, burst_bytes=25_000, cburst_bytes=25_000)
    # G-NETEM: ceil(1.5 x 1 Gbit/s x 300 us / 1500 B) = 38, plus the RED buffer in packets (3334)
    assert netem == Netem(delay_ns=300_000, limit_packets=38 + 3334)
    assert r.derived.netem_limit_rule_packets == 3372 and r.derived.netem_limit_below_rule is False
    assert r.derived.bdp_bytes == 7500            # the netem delay stands in for the base RTT


def test_step_with_axis_inside_the_arm_queue(runs: dict) -> None:
    for min_us, k in (("250us", 6250), ("500us", 12_500)):
        red = runs[("dctcp-step", min_us)].hosts["aqm"].qdiscs["client"][2]
        assert (red.min_bytes, red.max_bytes, red.probability, red.avpkt_bytes) == (k, k + 1, 1.0, 1500)
    assert runs[("dctcp-step", "250us")].flows[0].cc == "dctcp"


def test_step_threshold_has_a_two_mtu_floor() -> None:
    text = (PLANS / "good_red_netem.yaml").read_text().replace("rate: 200mbit", "rate: 10mbit")
    step = next(r for r in expand(load_plan_text(text)) if r.params["arm"] == "dctcp-step")
    red = step.hosts["aqm"].qdiscs["client"][2]
    assert red.min_bytes == 3000   # 10 Mbit/s x 250 us = 313 B < 2 x 1500 B


def test_ack_path_netem_from_host_qdiscs(runs: dict) -> None:
    assert runs[("reno-ramp", "250us")].hosts["aqm"].qdiscs["server"] == [Netem(delay_ns=1_000_000,
                                                                                 limit_packets=1000)]


def test_red_and_netem_mistakes() -> None:
    with pytest.raises(PlanError) as info:
        load_plan(PLANS / "bad_red.yaml")
    got = [(i.line, i.col, str(i).split(": ")[1]) for i in info.value.issues]
    assert got == [(8, 12, "run.bottleneck.delay"), (9, 41, "run.bottleneck.queue.max"),
                   (9, 55, "run.bottleneck.queue.limit"), (15, 70, "arms[1].set['bottleneck.queue'].max")]
    msgs = [i.message for i in info.value.issues]
    assert "line_rate" in msgs[0]
    assert "RED max (400us) must be above min (500us)" in msgs[1]
    assert "smaller than the upper threshold" in msgs[2]
    assert "one threshold" in msgs[3]


def test_explicit_netem_limit_below_the_rule_is_kept_and_flagged() -> None:
    text = (PLANS / "good_red_netem.yaml").read_text().replace("line_rate: 1gbit", "line_rate: 1gbit\n"
                                                                 "    netem_limit: 1000")
    r = expand(load_plan_text(text))[0]
    assert r.hosts["aqm"].qdiscs["client"][0] == Netem(delay_ns=300_000, limit_packets=1000)
    assert r.derived.netem_limit_below_rule is True
