"""On the netns lab (host kernel): the run's MTU is put on every data interface and the packets show it (frames
of 9014 bytes on the wire, IP total length 9000, from the capture's original-length field: the snaplen keeps
only 128 bytes), reset puts 1500 back; and a plan asking an offload the driver fixed is refused before any host
is touched."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
from sqlalchemy import text

from orchestrator.ingest.pcap_format import Frames, iter_frames
from tests.lab.conftest import run_lab_plan, run_plan_quietly, stored_flags

PLAN = """version: 1
name: hostmtu
roles: [client, aqm, server]
tags: [smoke]
run:
  duration: 3s
  mtu: {mtu}
  bottleneck:
    at: {{host: aqm, toward: client}}
    rate: 50mbit
    line_rate: 1gbit
    queue: {{kind: pfifo, limit: 100}}
  traffic: {{src: server, dst: client, cc: reno, flows: 1}}
  hosts:
    all:
      offloads: {{tso: off, gso: off, gro: off, sg: off{extra}}}
  captures:
    - {{host: aqm, toward: client}}
experiments:
  - name: one
"""


def parse_os_id() -> str:
    from agents.host.hostos import host_os
    return host_os().id


def link_mtus(inv) -> dict[str, int]:
    out = {}
    for role, host in inv.hosts.items():
        for dev in host.interfaces:
            shown = subprocess.run(["ip", "-n", host.namespace, "-j", "link", "show", "dev", dev],
                                   capture_output=True, text=True, check=True).stdout
            out[f"{role}:{dev}"] = json.loads(shown)[0]["mtu"]
    return out


def frame_lengths(pcap: Path) -> tuple[int, int, int]:
    """(frames, largest original frame length, largest IPv4 total length) of a capture."""
    frames, wire, ip_total = 0, 0, 0
    for block in iter_frames(pcap):
        if not isinstance(block, Frames) or block.data.size == 0:
            continue
        frames += block.data.size
        wire = max(wire, int(block.wirelen.max()))
        ethertype = block.buf[block.data + 12].astype(np.int64) << 8 | block.buf[block.data + 13]
        ipv4 = block.data[ethertype == 0x0800]
        if ipv4.size:
            total = block.buf[ipv4 + 16].astype(np.int64) << 8 | block.buf[ipv4 + 17]
            ip_total = max(ip_total, int(total.max()))
    return frames, wire, ip_total


def test_a_9000_byte_mtu_run_carries_9000_byte_packets_and_reset_restores_1500(lab, tmp_path):
    inv, state_dir = lab
    before = link_mtus(inv)
    assert set(before.values()) == {1500}
    plan = tmp_path / "mtu.yaml"
    plan.write_text(PLAN.format(mtu=9000, extra=""))
    db = run_lab_plan(plan, state_dir, tmp_path)
    [pcap] = (tmp_path / "results").glob("*/aqm/capture-*.pcap")
    frames, wire, ip_total = frame_lengths(pcap)
    print(f"{pcap.name}: {frames} frames, largest {wire} B on the wire, largest IPv4 total length {ip_total} B")
    assert frames > 1000
    assert wire == 9014 and ip_total == 9000
    assert link_mtus(inv) == before      # reset put every interface back
    # the veth's "10000Mb/s" is not a wire's: the 1gbit line rate is recorded as not checkable (G-NIC)
    [flags] = stored_flags(db).values()
    dev = inv.hosts["aqm"].iface_toward("client")
    assert [str(f) for f in flags if f.guard == "G-NIC"] == [
        f"G-NIC host aqm: {dev}: line rate not checkable on driver veth (driver veth is virtual: its speed is not "
        "a wire's; it reports 10000 Mb/s); the plan states 1000 Mbit/s"]
    with db.connect() as conn:           # each host's OS, as its agent reported it at hello
        oses = conn.execute(text("SELECT host, os_system, os_id FROM run_host ORDER BY host")).all()
    assert [tuple(r) for r in oses] == [(h, "Linux", parse_os_id()) for h in ("aqm", "client", "server")]


def test_a_1500_mtu_run_has_no_frame_over_1514(lab, tmp_path):
    """The control: the same plan at the default MTU (so 9014 above is the MTU's doing, not the capture's)."""
    inv, state_dir = lab
    plan = tmp_path / "mtu.yaml"
    plan.write_text(PLAN.format(mtu=1500, extra=""))
    run_lab_plan(plan, state_dir, tmp_path)
    [pcap] = (tmp_path / "results").glob("*/aqm/capture-*.pcap")
    frames, wire, ip_total = frame_lengths(pcap)
    assert frames > 1000 and wire == 1514 and ip_total == 1500


def test_a_fixed_offload_is_refused_before_any_host_is_touched(lab, tmp_path):
    inv, state_dir = lab
    before = link_mtus(inv)
    plan = tmp_path / "lro.yaml"
    plan.write_text(PLAN.format(mtu=9000, extra=", lro: on"))   # veth: "large-receive-offload: off [fixed]"
    rc, message = run_plan_quietly(plan, f"sqlite:///{tmp_path / 'refused.db'}", state_dir, tmp_path / "results")
    print(message)
    assert rc == 3
    assert "refused before touching any host" in message
    dev = inv.hosts["aqm"].iface_toward("client")
    assert f"interface {dev} (driver veth): offload lro is fixed off by the driver, the plan asks on" in message
    assert link_mtus(inv) == before      # not even the MTU (the first thing apply sets) was changed
    assert not any((tmp_path / "results").glob("*/runspec.json"))
