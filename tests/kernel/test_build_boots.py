"""A tcplab kernel build boots in a VM-lab guest and its patch shows in the packets (docs/kernels.md).

Debian's linux-source-6.1, tinyconfig + experiments/kernels/configs/vm-guest.config (everything a guest needs,
built in) + experiments/kernels/patches/tcp-init-cwnd-16.patch (TCP_INIT_CWND 10 -> 16). The aqm and the
server (the sender) boot the build; `uname -r` and the agent's hello name its release, LOCALVERSION and key
included. With 50 ms of netem on the aqm, the first flight of a socket that writes as soon as it connects is
alone in its round trip: it carries 16 full segments, where a stock kernel sends 10. The build is cached
(/var/cache/tcplab/kernels): the first run of this test builds it (~6-10 min on 2 cores), later ones boot it
at once.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from orchestrator.agent_client import AgentClient
from orchestrator.ingest.pcap import iter_pcap
from orchestrator.kernel import builder
from orchestrator.lab import netns, vm
from orchestrator.plan import load_plan
from tests.lab.conftest import TEST_PREFIX, skip_unless_vm_lab_can_run
from tests.support.shipped import ROOT

KERNELS = ROOT / "experiments" / "kernels"
PLAN = f"""
name: kguest
kernels:
  cwnd16-guest:
    vanilla: false
    source:
      package: linux-source-6.1
      config_base: tinyconfig
      patches: [{KERNELS}/patches/tcp-init-cwnd-16.patch]
      config: [{KERNELS}/configs/vm-guest.config]
      localversion: -cwnd16
run:
  duration: 5s
  traffic: {{src: server, dst: client, cc: reno, flows: 1}}
"""
MSS = 1448          # 1500 - 20 (IP) - 20 (TCP) - 12 (timestamps)
PORT = 5999
RECEIVER = f"""import socket, sys
s = socket.create_server((sys.argv[1], {PORT}))
c, _ = s.accept()
while c.recv(1 << 16):
    pass
"""
SENDER = f"""import socket, sys
s = socket.create_connection((sys.argv[1], {PORT}), timeout=20)
s.sendall(b"x" * 300_000)
s.close()
"""


def hello_release(inv: dict, role: str) -> str:
    async def go() -> str:
        client = AgentClient(role, inv["hosts"][role]["agent"], Path(inv["token_file"]).read_bytes().strip())
        h = await client.connect("test")
        await client.close()
        return h.capabilities.kernel_release
    return asyncio.run(go())


def first_flight_bytes(pcap: Path, sender: bytes, gap_ns: int) -> int:
    """Payload bytes of the largest connection's first flight: its data packets up to the first pause of
    `gap_ns` (the netem round trip the sender waits for ACKs)."""
    pkts = np.concatenate(list(iter_pcap(pcap)))
    data = pkts[(pkts["src_addr"] == sender) & (pkts["payload_len"] > 0)]
    ports, counts = np.unique(data["src_port"], return_counts=True)
    conn = data[data["src_port"] == ports[np.argmax(counts)]]
    ts = np.sort(conn["ts_ns"])
    gaps = np.flatnonzero(np.diff(ts) > gap_ns)
    end = gaps[0] + 1 if gaps.size else ts.size
    first = conn[np.argsort(conn["ts_ns"])][:end]
    return int(first["payload_len"].sum())


def test_a_patched_build_boots_in_a_guest_and_sends_a_first_flight_of_16(tmp_path):
    skip_unless_vm_lab_can_run()
    (tmp_path / "p.yaml").write_text(PLAN)
    variant = load_plan(tmp_path / "p.yaml").kernels["cwnd16-guest"]
    e = builder.build("cwnd16-guest", variant, tmp_path).entry
    deb = next(e.path.glob(f"linux-image-{e.release}_*.deb"))
    prefix, state_dir = f"{TEST_PREFIX}k", tmp_path / "lab"
    try:
        started = time.monotonic()
        inv = vm.up(state_dir, prefix, kernel=str(deb), vm_roles=("aqm", "server"), timeout_s=420)
        print(f"\nguests on {e.release}: agents ready after {inv['vm']['boot_s']} s "
              f"({time.monotonic() - started:.0f} s with the image)")
        assert inv["vm"]["release"] == e.release and e.key[:10] in e.release
        assert vm.guest_exec(["uname", "-r"], state_dir, role="server").stdout.strip() == e.release
        assert hello_release(inv, "server") == hello_release(inv, "aqm") == e.release
        tc = vm.guest_exec(["/usr/sbin/tc", "qdisc", "replace", "dev", "to-client", "root", "netem", "delay", "50ms",
                            "limit", "1000"], state_dir, role="aqm")
        assert tc.returncode == 0, tc.stderr
        client_ns = inv["hosts"]["client"]["namespace"]
        client_addr = inv["hosts"]["client"]["interfaces"]["to-aqm"]["addr"]
        # a plain socket pair, no application handshake: the sender's first flight is its initial window
        server = subprocess.Popen(["ip", "netns", "exec", client_ns, sys.executable, "-c", RECEIVER, client_addr])
        pcap = tmp_path / "client.pcap"
        # --immediate-mode: libpcap's TPACKET_V3 hands tcpdump a block only when it fills or its 1 s timeout
        # retires it, and SIGTERM drops a block not handed over -- a whole 300 KB flight fits in one (CI saw
        # an empty capture when the flow ended less than a second before the stop)
        dump = subprocess.Popen(["ip", "netns", "exec", client_ns, "tcpdump", "-i", "to-aqm", "-s", "96",
                                 "--immediate-mode", "-w", str(pcap), "-U", "tcp"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            # wait for tcpdump to say it listens rather than for a fixed time
            banner = dump.stderr.readline()
            assert "listening on" in banner, banner
            run = vm.guest_exec([sys.executable, "-c", SENDER, client_addr], state_dir, role="server")
            assert run.returncode == 0, run.stdout + run.stderr
            server.wait(timeout=30)
            time.sleep(0.5)
        finally:
            for p in (dump, server):
                p.terminate()
                p.wait(timeout=10)
        sender = inv["hosts"]["server"]["interfaces"]["to-aqm"]["addr"]
        packed = np.frombuffer(bytes(map(int, sender.split("."))) + bytes(12), dtype="V16")[0]
        flight = first_flight_bytes(pcap, packed, gap_ns=30_000_000)
        print(f"first flight: {flight} bytes = {flight / MSS:.2f} segments of {MSS} B")
        assert flight == 16 * MSS
    finally:
        vm.down(state_dir, prefix)
        assert netns.lab_namespaces(prefix) == []
