"""Pitfall guards (docs/guards.md): deliberately bad configurations trip their named guard; the shipped
study plans trip none they did not accept."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.guards.clock import clock_findings
from orchestrator.guards.pre_run import pre_run_findings, refusing
from orchestrator.plan import expand, load_plan, load_plan_text
from tests.support.shipped import STUDY_PLANS

ROOT = Path(__file__).resolve().parents[2]

PLAN = """
name: guards
roles: [sender, aqm, receiver]
run:
  duration: 20s
  base_rtt: 50ms
  bottleneck:
    at: {host: aqm, toward: receiver}
    rate: RATE
    BOTTLENECK
    queue: {kind: pfifo, limit: 100}
  traffic: {src: sender, dst: receiver, cc: cubic, flows: 1}
  hosts:
    all:
      offloads: OFFLOADS
      sysctls: {net.ipv4.tcp_wmem: "4096 16384 WMEM", net.ipv4.tcp_rmem: "4096 131072 33554432"}
ACCEPT
"""


def run(rate="100mbit", bottleneck="", offloads="{tso: false, gso: false, gro: false}", wmem="33554432",
        accept=""):
    text = (PLAN.replace("RATE", rate).replace("BOTTLENECK", bottleneck).replace("OFFLOADS", offloads)
            .replace("WMEM", wmem).replace("ACCEPT", accept))
    (spec,) = expand(load_plan_text(text, "guards.yaml"))
    return spec


def guards_of(spec) -> dict[str, str]:
    return {f.guard: str(f) for f in pre_run_findings(spec)}


def test_a_sound_configuration_trips_nothing() -> None:
    assert guards_of(run()) == {}


def test_htb_burst_of_one_mtu_at_1gbit() -> None:
    found = guards_of(run("1gbit", "burst: 1514B"))
    assert set(found) == {"G-HTB"}
    assert "burst 1514 B is below rate x 1 ms = 125000 B" in found["G-HTB"] and "host aqm" in found["G-HTB"]


def test_netem_limit_10_at_50ms() -> None:
    found = guards_of(run("100mbit", "delay: 50ms\n    netem_limit: 10"))
    assert set(found) == {"G-NETEM"}
    # ceil(1.5 x 100 Mbit/s x 50 ms / 1500 B) = 625, plus the pfifo's 100 packets
    assert "holds 10 packets" in found["G-NETEM"] and ">= 725" in found["G-NETEM"]


def test_offloads_left_on_while_the_queue_counts_packets() -> None:
    found = guards_of(run(offloads="{tso: true, gso: false}"))
    assert set(found) == {"G-OFFLOAD"} and "tso, gro not switched off" in found["G-OFFLOAD"]


def test_socket_buffer_below_the_bdp() -> None:
    found = guards_of(run(wmem="425984"))
    # 2 x (BDP 625000 B + pfifo 100 x 1514 B) = 1552800 B
    assert set(found) == {"G-SOCKBUF"} and "1552800 B" in found["G-SOCKBUF"] and "host sender" in found["G-SOCKBUF"]


def test_tsq_when_the_chain_sits_on_the_sender() -> None:
    text = PLAN.replace("host: aqm, toward: receiver", "host: sender, toward: aqm").replace("RATE", "1gbit")
    text = (text.replace("BOTTLENECK", "delay: 50ms\n    line_rate: 10gbit")
            .replace("OFFLOADS", "{tso: false, gso: false, gro: false}").replace("WMEM", "67108864")
            .replace("ACCEPT", "").replace("33554432", "67108864"))
    (spec,) = expand(load_plan_text(text, "tsq.yaml"))
    found = guards_of(spec)
    assert set(found) == {"G-TSQ"} and "tcp_limit_output_bytes = 1048576" in found["G-TSQ"]


def test_accepted_guards_do_not_refuse() -> None:
    spec = run("1gbit", "burst: 1514B", accept="  accept_guards: [G-HTB]")
    assert [f.guard for f in pre_run_findings(spec)] == ["G-HTB", "G-HTB"] and refusing(spec) == []


def test_clock_offsets() -> None:
    (f,) = clock_findings({"client": 20_000, "server": -2_500_000})
    assert f.guard == "G-CLOCK" and f.host == "server" and "2500 us" in str(f)


@pytest.mark.parametrize("path", STUDY_PLANS, ids=lambda p: p.name)
def test_shipped_plans_pass_their_guards(path: Path) -> None:
    assert [str(f) for r in expand(load_plan(path)) for f in refusing(r)] == []
