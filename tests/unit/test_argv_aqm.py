"""argv builders for the AQM and delay stages (pure): tc syntax as iproute2 6.1 reads it. Whether the
kernel accepts them is checked in the VM lab (tests/lab/test_vm_lab.py)."""
from __future__ import annotations

import pytest

from agents.host.argv import ChainError, RawQdisc, chain_argv
from schemas.qdiscs import Cake, Codel, DualPi2, Fq, FqCodel, FqPie, Htb, Mark, Netem, Pfifo, Pie, Red, tc_time


def test_times_are_written_in_microseconds() -> None:
    assert (tc_time(10_000_000), tc_time(250_000), tc_time(32_768)) == ("10000us", "250us", "32.768us")


def test_netem_htb_red_chain_in_plan_order() -> None:
    red = Red(limit_bytes=500_000, min_bytes=25_000, max_bytes=75_000, avpkt_bytes=1000, burst_packets=42,
              probability=0.1, bandwidth_bit=20_000_000, ecn=True, adaptive=True)
    cmds = chain_argv("to-client", [Netem(delay_ns=10_000_000, limit_packets=1000),
                                    Htb(rate_bit=20_000_000, burst_bytes=2500), red])
    assert cmds == [
        ["tc", "qdisc", "add", "dev", "to-client", "root", "handle", "1:", "netem", "delay", "10000us",
         "limit", "1000"],
        ["tc", "qdisc", "add", "dev", "to-client", "parent", "1:1", "handle", "2:", "htb", "default", "1"],
        ["tc", "class", "add", "dev", "to-client", "parent", "2:", "classid", "2:1", "htb", "rate",
         "20000000bit", "ceil", "20000000bit", "burst", "2500", "cburst", "2500"],
        ["tc", "qdisc", "add", "dev", "to-client", "parent", "2:1", "handle", "3:", "red", "limit", "500000",
         "min", "25000", "max", "75000", "avpkt", "1000", "burst", "42", "probability", "0.1", "bandwidth",
         "20000000bit", "ecn", "adaptive"]]


def test_netem_jitter_distribution_and_loss() -> None:
    (cmd,) = chain_argv("x", [Netem(delay_ns=5_000_000, jitter_ns=1_000_000, distribution="normal", loss=0.01,
                                    limit_packets=2000)])
    assert cmd[8:] == ["netem", "delay", "5000us", "1000us", "distribution", "normal", "loss", "1%", "limit", "2000"]


@pytest.mark.parametrize(("stage", "params"), [
    (FqCodel(), ["fq_codel", "ecn"]),
    (FqCodel(limit_packets=1000, target_ns=5_000_000, interval_ns=100_000_000, ce_threshold_ns=1_000_000,
             ecn=False), ["fq_codel", "limit", "1000", "target", "5000us", "interval", "100000us",
                          "ce_threshold", "1000us", "noecn"]),
    (Codel(target_ns=5_000_000, ecn=True), ["codel", "target", "5000us", "ecn"]),
    (Pie(limit_packets=1000, ecn=True, bytemode=True), ["pie", "limit", "1000", "ecn", "bytemode"]),
    (FqPie(ecn=False), ["fq_pie", "no_ecn"]),
    (Cake(bandwidth_bit=20_000_000, flow_mode="flows", diffserv="besteffort"),
     ["cake", "bandwidth", "20000000bit", "flows", "besteffort", "no-ack-filter"]),
    (Cake(), ["cake", "unlimited", "no-ack-filter"]),
    (Fq(initial_quantum_bytes=50_000, maxrate_bit=50_000_000, pacing=False),
     ["fq", "initial_quantum", "50000", "maxrate", "50000000bit", "nopacing"]),
])
def test_aqm_parameters(stage: object, params: list[str]) -> None:
    (cmd,) = chain_argv("x", [stage])
    assert cmd[:8] == ["tc", "qdisc", "add", "dev", "x", "root", "handle", "1:"] and cmd[8:] == params


def test_aqms_are_leaves_and_mark_goes_over_netlink_not_tc() -> None:
    with pytest.raises(ChainError, match="cannot have a child"):
        chain_argv("x", [FqCodel(), Pfifo(limit_packets=10)])
    with pytest.raises(ChainError, match="cannot have a child"):
        chain_argv("x", [Mark(mode="step", min_ns=1_000_000, limit_packets=100), Pfifo(limit_packets=10)])
    netem, htb, htb_class, mark = chain_argv("to-client", [Netem(delay_ns=10_000_000, limit_packets=1000),
                                                           Htb(rate_bit=20_000_000, burst_bytes=2500),
                                                           Mark(mode="step", min_ns=2_000_000, limit_packets=1000)])
    assert htb[:8] == ["tc", "qdisc", "add", "dev", "to-client", "parent", "1:1", "handle"]
    assert htb_class[:3] == ["tc", "class", "add"]
    assert netem[:8] == ["tc", "qdisc", "add", "dev", "to-client", "root", "handle", "1:"]
    assert mark == RawQdisc("to-client", "2:1", "3:", "aqm_mark", bytes.fromhex(
        "0800010000000000" "0800020000000000" "0c000300" "80841e0000000000" "0c00040000000000" "00000000"
        "08000500e8030000" "0500060001000000" "0c00070000000000" "00000000"))


def test_dualpi2_goes_over_netlink_with_the_nested_flag() -> None:
    _, _, dualpi2 = chain_argv("to-client", [Htb(rate_bit=10_000_000, burst_bytes=2500),
                                             DualPi2(limit_packets=1000, step_thresh_ns=1_000_000, coupling_factor=2,
                                                     ecn_mask="l4s_ect", split_gso=True)])
    # sch_dualpi2 parses TCA_OPTIONS with nla_parse_nested: without NLA_F_NESTED the kernel says EINVAL
    assert dualpi2 == RawQdisc("to-client", "1:1", "2:", "dualpi2", bytes.fromhex(
        "08000100e8030000" "08000800e8030000" "05000a0002000000" "05000e0001000000" "05000f0001000000"), nested=True)
    (mark,) = chain_argv("x", [Mark(mode="step", min_ns=2_000_000, limit_packets=1000)])
    assert mark.nested is False   # aqm_mark parses them with nla_parse_nested_deprecated, as sent since


def test_red_probability_one_is_capped_below_the_u32_overflow() -> None:
    red = Red(limit_bytes=500_000, min_bytes=3000, max_bytes=3001, avpkt_bytes=1500, burst_packets=3,
              probability=1.0, bandwidth_bit=20_000_000, ecn=True)
    (cmd,) = chain_argv("x", [red])
    assert cmd[cmd.index("probability") + 1] == "0.99999999"
