"""Faults on one testbed host while a real run's flows are running: its agent killed, its control connection
silenced (agent stopped), its artifacts filesystem full. Each run must be recorded failed with a reason naming
the host, the other hosts reset, and no completed run lost."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from orchestrator.agent_client import CLOSE_TIMEOUT_S, PING_INTERVAL_S, PING_TIMEOUT_S
from orchestrator.engine import marker
from orchestrator.lab.netns import AGENT_ARTIFACTS, pid_alive
from tests.fault.conftest import Background, ns_pids, run_ids, short_plan, wait_for
from tests.lab.conftest import stored_flags

ALL = ("client", "aqm", "server")


def flows_running(fault_lab) -> bool:
    """The run's iperf3 pair is up: the sender's client and the receiver's server both exist."""
    return bool(ns_pids(fault_lab.namespace("server"), "iperf3")) and bool(ns_pids(fault_lab.namespace("client"),
                                                                                       "iperf3"))


def assert_others_reset(fault_lab, run_id: str, faulty: str) -> None:
    reset = fault_lab.evidence(run_id, "reset")
    for role in ALL:
        if role != faulty:
            assert reset[role]["restored"] is True, (role, reset[role])
    print("reset evidence: " + "; ".join(f"{r}: restored={d.get('restored')}" + (f" ({d['error'][:60]})"
                                                                                  if d.get("error") else "")
                                         for r, d in sorted(reset.items())))


def offloads(namespace: str) -> dict[str, str]:
    """`ethtool -k` of every interface in a lab namespace except lo: the state the plan turns off."""
    links = json.loads(subprocess.run(["ip", "-n", namespace, "-j", "link", "show"], capture_output=True,
                                      text=True, check=True).stdout)
    state = {}
    for dev in (link["ifname"] for link in links if link["ifname"] != "lo"):
        out = subprocess.run(["ip", "netns", "exec", namespace, "ethtool", "-k", dev], capture_output=True,
                             text=True, check=True).stdout
        state |= {f"{dev} {k.strip()}": v.split()[0] for k, _, v in (line.partition(":") for line in out.splitlines())
                  if k.strip() in ("tcp-segmentation-offload", "generic-segmentation-offload",
                                   "generic-receive-offload", "scatter-gather")}
    return state


def test_agent_killed_mid_run_fails_the_run_and_the_restarted_agent_runs_the_next(fault_lab, tmp_path, ledger):
    began = time.monotonic()
    plan = short_plan(tmp_path, "fault-agent-kill", duration="3s", repetitions=2)
    killed_run, next_run = run_ids(plan)
    before = fault_lab.complete_runs()
    victim = fault_lab.agent_pid("client")
    clean = offloads(fault_lab.namespace("client"))
    assert "on" in clean.values(), clean   # the plan turns them off: a reset must turn them back on
    job = Background(lambda: fault_lab.run(plan))
    wait_for("the flows to run", lambda: flows_running(fault_lab), 30)
    os.kill(victim, signal.SIGKILL)
    # the killed agent's iperf3 server dies with it (PR_SET_PDEATHSIG), not at `lab down`
    wait_for("the dead agent's iperf3 to die with it", lambda: not ns_pids(fault_lab.namespace("client"), "iperf3"),
             5)
    rc, out = job.join(120)
    print(out)
    row = fault_lab.run_row(killed_run)
    assert rc == 1 and row.status == "failed", (rc, row)
    assert "agent client" in row.error and "lost" in row.error, row.error
    assert_others_reset(fault_lab, killed_run, "client")
    print(f"agent client SIGKILLed mid-run: {row.error}")
    # the supervisor restarted the agent; the engine reconnected it for the plan's next run
    restarted = fault_lab.agent_pid("client")
    assert restarted != victim and pid_alive(restarted)
    assert fault_lab.run_row(next_run).status == "complete", out
    # and the next `tcplab run` reruns the failed run
    rc, out = fault_lab.run(plan)
    print(out)
    assert rc == 0 and fault_lab.run_row(killed_run).status == "complete", out
    # the restarted agent adopted the dead one's reset baseline: the host is back as it was before the plan,
    # not frozen with the killed run's offloads as a new "clean"
    assert offloads(fault_lab.namespace("client")) == clean
    after = fault_lab.complete_runs()
    lost = sum(1 for r, fin in before.items() if after.get(r) != fin)
    took = time.monotonic() - began
    ledger.fault("agent killed mid-run", survived=lost == 0, runs_lost=lost,
                 detail=f"run failed naming the host, children died with the agent, agent restarted with its baseline, "
                        f"next run and rerun complete, host restored; test {took:.0f} s")
    print(f"agent kill: {took:.1f} s, runs lost {lost}")
    assert lost == 0


def test_silent_control_connection_is_detected_within_the_keepalive_bound(fault_lab, tmp_path, ledger):
    began = time.monotonic()
    plan = short_plan(tmp_path, "fault-conn-cut", duration="3s")
    before = fault_lab.complete_runs()
    victim = fault_lab.agent_pid("aqm")
    job = Background(lambda: fault_lab.run(plan))
    run_dir = fault_lab.results / run_ids(plan)[0]
    try:
        wait_for("the flows to run", lambda: flows_running(fault_lab), 30)
        os.kill(victim, signal.SIGSTOP)   # the agent stops answering: no reply, no pong, connection stays open
        stopped_at = time.monotonic()
        wait_for("the run to be recorded", lambda: (m := marker.read(run_dir)) is None or m.phase == marker.INGEST,
                 60, step_s=0.05)
        detected = time.monotonic() - stopped_at
        rc, out = job.join(60)
    finally:
        os.kill(victim, signal.SIGCONT)
    print(out)
    row = fault_lab.run_row(run_dir.name)
    bound = PING_INTERVAL_S + PING_TIMEOUT_S + CLOSE_TIMEOUT_S
    print(f"control connection of aqm silenced (SIGSTOP): run failed {detected:.1f} s later "
          f"(keepalive bound {bound:.0f} s): {row.error}")
    assert rc == 1 and row.status == "failed" and "agent aqm" in row.error, (rc, row)
    assert detected <= bound + 5   # + the other hosts' reset
    assert_others_reset(fault_lab, run_dir.name, "aqm")
    assert any(f.guard == "G-RESET" and f.host == "aqm" and "reset not done" in f.message
               for f in stored_flags(fault_lab.db)[run_dir.name])   # the unreset host is named on the run
    after = fault_lab.complete_runs()
    lost = sum(1 for r, fin in before.items() if after.get(r) != fin)
    took = time.monotonic() - began
    ledger.fault("control connection silenced", survived=detected <= 30 and lost == 0, runs_lost=lost,
                 detail=f"detected in {detected:.1f} s; test {took:.0f} s")
    assert lost == 0


def test_full_artifacts_disk_fails_the_run_naming_host_and_task(fault_lab, tmp_path, ledger):
    began = time.monotonic()
    plan = short_plan(tmp_path, "fault-disk-full", duration="3s", captures=True)
    before = fault_lab.complete_runs()
    agent = fault_lab.agent_pid("aqm")
    root = AGENT_ARTIFACTS / fault_lab.prefix / "aqm"
    # a 256 KiB filesystem in the aqm agent's own mount namespace, where its artifacts root is (0700: the agent
    # checks its root only at start, but keep it private like agents/rootdir.py wants)
    in_agent = ["nsenter", "-t", str(agent), "-m"]
    subprocess.run([*in_agent, "mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tcplab-fault-full", str(root)],
                   check=True)
    try:
        mounts = subprocess.run([*in_agent, "findmnt", "-n", "-o", "SIZE", str(root)], capture_output=True,
                                text=True, check=True).stdout.strip()
        print(f"aqm agent's artifacts root {root}: tmpfs of {mounts}")
        rc, out = fault_lab.run(plan)
    finally:
        subprocess.run([*in_agent, "umount", str(root)], check=True)
    print(out)
    run_id = run_ids(plan)[0]
    row = fault_lab.run_row(run_id)
    print(f"aqm artifacts filesystem full: {row.error}")
    assert rc == 1 and row.status == "failed", (rc, row)
    assert "no space left on device" in row.error and "aqm/capture-" in row.error, row.error
    assert_others_reset(fault_lab, run_id, "")
    after = fault_lab.complete_runs()
    lost = sum(1 for r, fin in before.items() if after.get(r) != fin)
    took = time.monotonic() - began
    ledger.fault("artifacts disk full", survived=lost == 0, runs_lost=lost, detail=f"test {took:.0f} s")
    assert lost == 0
