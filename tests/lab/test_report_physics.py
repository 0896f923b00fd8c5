"""The report checked against physics on the netns lab (docs/metrics.md: M-QDELAY, M-UTIL).

A loss-based CC (CUBIC) fills a pfifo of LIMIT packets behind htb: every packet that joins a full queue
waits for the LIMIT − 1 packets ahead of it plus its own serialisation, so the queue delay peaks at
LIMIT × 1514 B × 8 / rate (1500 B MTU + 14 B Ethernet header, what htb counts) and the top percentiles sit
there. The link is saturated, so wire utilisation ≈ 1 and goodput / rate ≈ 1448 / 1514 (1448 payload
bytes per 1514-byte frame with TCP timestamps). Two runs of 6 s with a 1 s warm-up. A run the framework
flags G-CPULOAD (the shared lab machine saturated: CI once saw 0.90 utilisation and 25 ms stalls at 50
Mbit/s) is run again, see run_lab_plan_unloaded.
"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from analysis.report import write_report
from tests.lab.conftest import run_lab_plan_unloaded

LIMIT = 30
FRAME = 1514
PAYLOAD_SHARE = 1448 / 1514
PLAN = f"""
version: 1
name: physics
description: pfifo buffers that fill (report physics check)
roles: [client, aqm, server]
tags: [smoke]
repetitions: 1
seed: 1
run:
  duration: 6s
  mtu: 1500
  bottleneck:
    at: {{host: aqm, toward: client}}
    rate: 20mbit
    queue: {{kind: pfifo, limit: {LIMIT}}}
  traffic: {{tool: iperf3, src: server, dst: client, cc: cubic, flows: 1, base_port: 5201}}
  hosts:
    all:
      offloads: {{tso: off, gso: off, gro: off, sg: off}}
      sysctls:
        net.ipv4.tcp_no_metrics_save: 1
        net.ipv4.tcp_sack: 1
        net.ipv4.tcp_timestamps: 1
        net.ipv4.tcp_ecn: 0
        net.ipv4.tcp_rmem: "4096 131072 8388608"
        net.ipv4.tcp_wmem: "4096 131072 8388608"
  captures:
    - {{host: aqm, toward: client}}
    - {{host: aqm, toward: server}}
  qdisc_stats: {{links: [{{host: aqm, toward: client}}], interval: 10ms}}
  tcp_probe: true
  analysis: {{warmup: 1s}}
matrix:
  axes:
    bottleneck.rate: [20mbit, 50mbit]
"""


@pytest.fixture(scope="module")
def physics_report(lab, tmp_path_factory):
    _, state_dir = lab
    out = tmp_path_factory.mktemp("physics")
    plan = out / "physics.yaml"
    plan.write_text(PLAN)
    db = run_lab_plan_unloaded(plan, state_dir, out)
    write_report(db, out / "report")
    with (out / "report" / "tables" / "runs_detail.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_queue_delay_of_a_full_pfifo_is_buffer_over_rate(physics_report):
    assert len(physics_report) == 2
    for run in physics_report:
        rate = int(run["rate_bit"])
        full_us = LIMIT * FRAME * 8 / rate * 1e6
        p95, p99, mean = float(run["qdelay_us_p95"]), float(run["qdelay_us_p99"]), float(run["qdelay_us_mean"])
        print(f"{run['run_id']} {rate / 1e6:g} Mbit/s: queue delay expected (full) {full_us:.0f} µs, "
              f"reported p99 {p99:.0f} µs, max {float(run['qdelay_us_max']):.0f} µs, mean {mean:.0f} µs; "
              f"utilisation wire {float(run['util_wire']):.4f}, payload {float(run['util_payload']):.4f} "
              f"(expected {PAYLOAD_SHARE:.4f})")
        # A full 30-packet pfifo cannot hold more than full_us of data: delay beyond it is dequeue stalls of
        # the lab host (htb's timer and softirq run late on a busy 2-core machine; CI saw p99 24 ms, max
        # 35 ms at 20 Mbit/s with the qdisc's own backlog never above 30 packets). p95 reads the buffer.
        assert abs(p95 - full_us) <= 0.10 * full_us, (run["run_id"], p95, p99, full_us)
        # CUBIC backs off to 0.7 x cwnd: with ~no base RTT the queue swings between ~0.7 and 1 x full
        assert 0.55 * full_us <= mean <= full_us, (run["run_id"], mean, full_us)


def test_utilisation_of_a_saturated_link(physics_report):
    for run in physics_report:
        assert 0.97 <= float(run["util_wire"]) <= 1.02, run["run_id"]
        assert abs(float(run["util_payload"]) - PAYLOAD_SHARE) <= 0.02 * PAYLOAD_SHARE, run["run_id"]
        assert abs(float(run["goodput_bps"]) / int(run["rate_bit"]) - PAYLOAD_SHARE) <= 0.03, run["run_id"]


def test_report_page_names_the_window_and_every_run(physics_report, tmp_path_factory):
    page = next(Path(tmp_path_factory.getbasetemp()).glob("physics*/report/report.html")).read_text()
    assert "warm-up 1 s" in page
    for run in physics_report:
        assert run["run_id"] in page
