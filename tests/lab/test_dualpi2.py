"""DualPI2 (RFC 9332) as real kernel code on a Debian 7.2 guest, its coupling proven from packets.

Debian's 7.2 kernels (unstable) do not ship sch_dualpi2.ko: it is built from linux-source-7.2's
net/sched/sch_dualpi2.c against Debian's 7.2 headers (orchestrator/kernel/debian_modules.py). The VM lab boots
the aqm guest on linux-image-7.2.13+deb14-amd64, which insmods the .ko from its host path; htb 10 Mbit/s is the
bottleneck on the aqm's to-client with dualpi2 (defaults, written out) as its leaf, configured and read back
over netlink from inside the guest (orchestrator/kernel/dualpi2_nl.py; iproute2 6.1 knows no dualpi2).

The flows, from the server namespace to the client namespace (the host kernel, 6.18):
- classic: TCP cubic with ECN (tcp_ecn=1: ECT(0), so it is classified into the C queue);
- L4S: UDP at 2 Mbit/s sent with IP_TOS 0x01, i.e. ECT(1) set by the sender itself (`iperf3 -u --tos 1`).
  No TCP sender here can set ECT(1): the host kernel has no dctcp and 7.2 has no in-tree congestion control
  with TCP_CONG_ECT_1_NEGOTIATION (prague is out of tree), and rewriting a classic TCP flow's ECN field on
  the way would put a non-scalable sender in the L queue. An unresponsive ECT(1) flow below the bottleneck rate
  tests what the qdisc does -- classification, L queue latency, the coupled marking law -- not an L4S sender.

Proven from paired captures on the aqm's to-server (ingress) and to-client (egress) (orchestrator/ingest/
qdelay.py) and from the xstats sampled in the guest during the transfer (`dualpi2_nl watch`, the capture's
clock): the L packets' queue delay is far below the classic one; every CE seen leaving is counted in
`ecn_mark`; and the marks follow the coupling at each packet's dequeue time t: the L packets are marked with
probability k·p'(t) (k = 2) and the classic ones with p'(t)^2 (sch_dualpi2.c: dualpi2_scalable_marking rolls
once with prob·coupling, dualpi2_classic_marking rolls twice with prob), checked where the guest sampled p'
on time (tests/lab/dualpi2_coupling.py).

Needs root, QEMU, busybox-static, gcc and make, and Debian's archive (unstable for the 7.2 packages): it
installs nothing on this machine and skips naming what is missing. Bounded to ~5 minutes; the lab always
goes down.
"""
from __future__ import annotations

import json
import re
import subprocess
import time

import numpy as np
import pytest

from orchestrator.ingest import qdelay
from orchestrator.ingest.pcap import read_pcap
from orchestrator.lab import vm_host
from orchestrator.storage.records import PROTO_TCP, PROTO_UDP
from schemas.qdiscs import dualpi2_netlink as dn
from tests.lab import dualpi2_coupling as cp
from tests.lab.conftest import (
    TEST_PREFIX,
    build_guest_module,
    guest_bottleneck,
    guest_fetch,
    guest_ok,
    vm_lab_up,
    vm_unavailable,
)

KERNEL = "linux-image-7.2.13+deb14-amd64"
PREFIX = f"{TEST_PREFIX}d2"[:12]
TCP_PORT, UDP_PORT = 5401, 5402
SECONDS = 30
K = 2
EVERY_S, MAX_GAP_S = 0.1, 0.25  # xstats sampling period; a longer gap means the guest stalled
# what is sent: the kernel's defaults written out (sch_dualpi2.c dualpi2_reset_default), limit 1000
ASKED = {dn.LIMIT: 1000, dn.TARGET: 15000, dn.TUPDATE: 16000, dn.STEP_THRESH_US: 1000, dn.COUPLING: K,
         dn.ECN_MASK: dn.ECN_MASKS["l4s_ect"]}
CHAIN = ["tc qdisc replace dev to-client root handle 1: htb default 1",
         "tc class add dev to-client parent 1: classid 1:1 htb rate 10mbit ceil 10mbit burst 2500 cburst 2500"]


@pytest.fixture(scope="module")
def dualpi2_lab(tmp_path_factory):
    if reason := vm_unavailable():  # before building: the build writes to the root-owned cache
        pytest.skip(reason)
    built = build_guest_module("sch_dualpi2", KERNEL, ("make", "gcc", "modinfo", "dpkg-deb", "apt-get", "tar", "xz"),
                               900)
    for inv, state_dir in vm_lab_up(tmp_path_factory, PREFIX, ("aqm",), timeout_s=300, kernel=KERNEL):
        yield built, inv, state_dir


def _dualpi2_nl(*args: str) -> str:
    python, _ = vm_host.guest_interpreter()
    return f"cd {vm_host.REPO_ROOT} && exec {python} -m orchestrator.kernel.dualpi2_nl " + " ".join(args)


def _iperf3_pair(client_ns: str, server_ns: str, client_addr: str) -> tuple[dict, dict]:
    """A TCP cubic flow and a UDP ECT(1) flow at once, server ns -> client ns; both receivers exit after one
    test (-1) and are waited on."""
    receivers = [subprocess.Popen(["ip", "netns", "exec", client_ns, "iperf3", "-s", "-1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for port in (TCP_PORT, UDP_PORT)]
    senders: list[subprocess.Popen] = []
    try:
        time.sleep(0.5)
        base = ["ip", "netns", "exec", server_ns, "iperf3", "-c", client_addr, "-t", str(SECONDS), "-J"]
        for extra in (["-p", str(TCP_PORT), "-C", "cubic"],
                      ["-p", str(UDP_PORT), "-u", "-b", "2M", "-l", "1200", "--tos", "1"]):
            senders.append(subprocess.Popen([*base, *extra], stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=SECONDS + 60)[0] for p in senders]
    finally:
        for r in senders + receivers:  # our own children, by pid
            try:
                r.wait(timeout=20)
            except subprocess.TimeoutExpired:
                r.kill()
                r.wait()
    return json.loads(outs[0]), json.loads(outs[1])


def test_dualpi2_couples_l4s_marks_to_the_classic_queue(dualpi2_lab, tmp_path):
    built, inv, state_dir = dualpi2_lab
    t0 = time.monotonic()
    guest_bottleneck(state_dir, built.ko, "sch_dualpi2", CHAIN)
    args = ["--dev", "to-client", "--parent", "1:1", "--handle", "2:", "--limit", str(ASKED[dn.LIMIT]),
            "--target-us", str(ASKED[dn.TARGET]), "--tupdate-us", str(ASKED[dn.TUPDATE]),
            "--step-thresh-us", str(ASKED[dn.STEP_THRESH_US]), "--coupling", str(K), "--ecn-mask", "l4s_ect"]
    shown = json.loads(guest_ok(state_dir, ["sh", "-c", _dualpi2_nl("add", *args)], timeout_s=120))
    assert len(shown) == 1 and shown[0]["handle"] == "2:" and shown[0]["parent"] == "1:1", shown
    assert shown[0]["mismatches"] == [], shown  # the read-back over netlink is what was asked
    print(f"configured + read back in the guest: {shown[0]['options']} hex {shown[0]['options_hex']} "
          f"({time.monotonic() - t0:.1f} s so far)")

    client_ns, server_ns = inv["hosts"]["client"]["namespace"], inv["hosts"]["server"]["namespace"]
    client_addr = inv["hosts"]["client"]["interfaces"]["to-aqm"]["addr"]
    for ns in (client_ns, server_ns):
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_ecn=1"], check=True)
    flt = f"tcp port {TCP_PORT} or udp port {UDP_PORT}"
    pids = guest_ok(state_dir, ["sh", "-c", " ; ".join(
        [f"tcpdump -n -i {dev} -s 128 -w /tmp/d2-{dev}.pcap '{flt}' >/tmp/d2-{dev}.log 2>&1 & echo $!"
         for dev in ("to-server", "to-client")]
        + [_dualpi2_nl("watch", "--dev", "to-client", "--every", str(EVERY_S), "--count",
                      str(int((SECONDS + 40) / EVERY_S)))
           + " >/tmp/d2-watch.jsonl 2>/tmp/d2-watch.log & echo $!"])]).split()
    # the watcher's first sample: starting Python with pyroute2 under TCG takes ~10 s, and p' must be known
    # from the transfer's first packet
    guest_ok(state_dir, ["sh", "-c", "i=0; while [ ! -s /tmp/d2-watch.jsonl ] && [ $i -lt 60 ]; do "
                         "sleep 1; i=$((i+1)); done; test -s /tmp/d2-watch.jsonl"], timeout_s=90)
    tcp, udp = _iperf3_pair(client_ns, server_ns, client_addr)
    time.sleep(1)
    guest_ok(state_dir, ["kill", "-INT", *pids])
    time.sleep(1.5)
    assert "error" not in tcp and "error" not in udp, (tcp.get("error"), udp.get("error"))
    # `change` over netlink (k = 3, step 2 ms), read back in the same call with the xstats the transfer left
    # (change keeps the counters)
    final = json.loads(guest_ok(state_dir, ["sh", "-c", _dualpi2_nl(
        "change", "--dev", "to-client", "--parent", "1:1", "--handle", "2:", "--coupling", "3",
        "--step-thresh-us", "2000")], timeout_s=120))[0]
    assert final["mismatches"] == [] and final["options"]["coupling_factor"] == 3, final
    assert final["options"]["step_thresh_us"] == 2000 and final["options"]["target_us"] == 15000, final
    xs = final["xstats"]
    samples = [json.loads(line) for line in guest_ok(state_dir, ["cat", "/tmp/d2-watch.jsonl"]).splitlines() if line]
    tcpdump_logs = guest_ok(state_dir, ["sh", "-c", "cat /tmp/d2-to-server.log /tmp/d2-to-client.log"])
    (tmp_path / "watch.json").write_text(json.dumps(samples))

    ingress = read_pcap(guest_fetch(state_dir, "/tmp/d2-to-server.pcap", tmp_path / "in.pcap"), point=0)
    egress = read_pcap(guest_fetch(state_dir, "/tmp/d2-to-client.pcap", tmp_path / "out.pcap"), point=1)

    def data(p: np.ndarray) -> np.ndarray:  # UDP: not iperf3's 4-byte hello, sent before it sets the TOS
        return p[((p["proto"] == PROTO_TCP) & (p["dst_port"] == TCP_PORT) & (p["payload_len"] > 0))
                 | ((p["proto"] == PROTO_UDP) & (p["dst_port"] == UDP_PORT) & (p["payload_len"] > 4))]

    data_in, data_out = data(ingress), data(egress)
    res = qdelay.pair(data_in, data_out, d_fwd_ns=None, netem_ns=0)
    is_l = data_in["proto"] == PROTO_UDP
    kept = res.rows["dropped"] == 0
    rows_l, rows_c = res.rows[is_l & kept], res.rows[~is_l & kept]
    ce_l, ce_c = int(rows_l["ce"].sum()), int(rows_c["ce"].sum())
    dropped_c = int((~is_l & ~kept).sum())
    # An L packet may be marked twice: by the coupling (must_drop, at dequeue) and then by the step
    # (do_step_aqm); INET_ECN_set_ce returns true on a CE packet too, so ecn_mark counts both and step_marks
    # the second: ecn_mark = coupled L marks + step_marks + classic marks, and the CE packets seen are fewer by
    # the double marks.
    double = xs["ecn_mark"] - ce_l - ce_c
    left = res.rows[kept]
    eligible = cp.backlog_at_dequeue(left["ts_in_ns"], left["ts_out_ns"], (data_in["ip_len"][kept] + 14)) \
        >= cp.MIN_BACKLOG
    law = cp.coupling(samples, rows_l["ts_out_ns"], rows_c["ts_out_ns"], rows_c["ce"].astype(float), K, MAX_GAP_S,
                      ASKED[dn.TARGET], eligible[is_l[kept]], eligible[~is_l[kept]])
    law["ratio_l"] = round(law["coupled_l"] / max(law["expected_l"], 1), 3)
    law["ratio_c"] = round(law["ce_c"] / max(law["expected_c"], 1), 3)
    evidence = {
        "tcp_mbit": round(tcp["end"]["sum_received"]["bits_per_second"] / 1e6, 2),
        "udp_mbit": round(udp["end"]["sum"]["bits_per_second"] / 1e6, 2),
        "l_in": int(is_l.sum()), "c_in": int((~is_l).sum()), "ect1_in": int((data_in["ecn"] == 1).sum()),
        "ect0_c_in": int((data_in["ecn"][~is_l] == 2).sum()),
        "matched": res.matched, "dropped_l": int((is_l & ~kept).sum()), "dropped_c": dropped_c,
        "qdelay_ms_l_p50_p99": [round(float(np.percentile(rows_l["sojourn_ns"], q)) / 1e6, 3) for q in (50, 99)],
        "qdelay_ms_c_p50_p99": [round(float(np.percentile(rows_c["sojourn_ns"], q)) / 1e6, 3) for q in (50, 99)],
        "d_fwd_ms": round(res.d_fwd_ns / 1e6, 3),
        "ce_l": ce_l, "ce_c": ce_c, "frac_ce_l": round(ce_l / max(len(rows_l), 1), 4),
        "frac_ce_c": round(ce_c / max(len(rows_c), 1), 5), "double_marked_l": double, "coupling": law,
        "qdisc_stats": final["stats"],
        "tcpdump_dropped": [int(n) for n in re.findall(r"(\d+) packets? dropped by kernel", tcpdump_logs)],
        "samples": len(samples), "mean_p_prime": round(float(np.mean([s["xstats"]["p_prime"] for s in samples])), 5),
        "xstats": xs, "xstats_hex": final["xstats_hex"], "test_s": round(time.monotonic() - t0, 1)}
    print(f"packet evidence: {json.dumps(evidence)}")

    assert evidence["ect1_in"] == evidence["l_in"] > 1000, "the UDP sender did not set ECT(1)"
    assert evidence["ect0_c_in"] > 0.95 * evidence["c_in"], "the TCP sender did not negotiate ECN"
    assert res.matched > 0.95 * data_in.size, evidence
    # what is missing at the egress is what the qdisc dropped (tcpdump lost nothing), so counting them as drops
    # is right
    assert evidence["tcpdump_dropped"] == [0, 0], evidence
    assert evidence["dropped_l"] + dropped_c <= final["stats"]["drop"], evidence
    assert xs["packets_in_l"] >= evidence["l_in"] and xs["packets_in_c"] >= evidence["c_in"] - 50, evidence
    # every CE seen leaving is one the qdisc counted; the rest of its count are second (step) marks of L packets
    assert 0 <= double <= xs["step_marks"] and ce_c <= xs["ecn_mark"], evidence
    # the L queue stays short while the classic one sits near its 15 ms target (TCG stalls of the one vCPU
    # push both tails up together)
    l50, c50 = evidence["qdelay_ms_l_p50_p99"][0], evidence["qdelay_ms_c_p50_p99"][0]
    assert l50 < 2.0 and c50 > 5.0 and c50 > 5 * l50, evidence
    # The coupling law (dualpi2_coupling.py), in the steady intervals, which must cover most of the transfer:
    # marks counted against marks expected from p'(t) at each packet's dequeue. The expected counts are sums of
    # Bernoulli trials (sd = sqrt(sum p(1-p)): ~3 % of ~1000 L marks, ~8 % of ~150 classic ones), plus the error
    # of interpolating p' between samples ~0.1 s apart while it moves every 16 ms. The bands hold several of
    # those and still reject the neighbouring laws: k = 1 or 3 would give 0.5 or 1.5 for L; p_C = 2p'^2 gives
    # 2, p_C = p' (no square) ~8x for the classic queue.
    assert law["steady_s"] > 0.6 * SECONDS, evidence
    assert law["ce_c"] > 30 and law["coupled_l"] > 200, f"too few marks to judge the coupling: {evidence}"
    assert 0.8 < law["ratio_l"] < 1.25, evidence
    assert 0.6 < law["ratio_c"] < 1.6, evidence
    assert law["expected_c_if_linear"] > 3 * law["ce_c"], evidence
