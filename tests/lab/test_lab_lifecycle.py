"""`tcplab lab up|down|status`: builds a working lab, and `down` cleans up even after a crash."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.lab import netns
from tests.lab.conftest import lab_unavailable

PREFIX = "tcplabcycle"


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture
def cycle_env(tmp_path):
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, TCPLAB_LAB_DIR=str(tmp_path / "state"), TCPLAB_LAB_PREFIX=PREFIX)
    yield env
    netns.down(tmp_path / "state", PREFIX)


def test_up_status_down_via_cli(cycle_env):
    assert cli("lab", "up", env=cycle_env).returncode == 0
    st = json.loads(cli("lab", "status", "--json", env=cycle_env).stdout)
    assert st["healthy"] is True
    assert st["namespaces"] == [f"{PREFIX}-aqm", f"{PREFIX}-client", f"{PREFIX}-server"]
    assert sorted(a["role"] for a in st["agents"]) == ["aqm", "client", "server"]
    addrs = {(lk["namespace"], lk["ifname"]): lk["addr"] for lk in st["links"]}
    assert "10.199.1.254" in addrs[(f"{PREFIX}-aqm", "to-client")]
    # the forwarding path works end to end: client pings server through the aqm
    ping = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-client", "ping", "-c", "1", "-W", "2", "10.199.2.1"],
                          capture_output=True, text=True)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert cli("lab", "down", env=cycle_env).returncode == 0
    st = json.loads(cli("lab", "status", "--json", env=cycle_env).stdout)
    assert st == {"healthy": False, "inventory": None, "namespaces": [], "agents": [], "links": []}


def test_down_after_crash_removes_everything(cycle_env, tmp_path):
    assert cli("lab", "up", env=cycle_env).returncode == 0
    inv = json.loads((tmp_path / "state" / "inventory.json").read_text())
    agents = json.loads((tmp_path / "state" / "agents.json").read_text())
    os.kill(inv["supervisor_pid"], signal.SIGKILL)      # the lab's parent dies without cleaning up
    time.sleep(0.3)
    # a process left running inside a lab namespace, as a crashed run would leave iperf3 behind
    stray = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-server", "sleep", "300"])
    time.sleep(0.3)
    out = cli("lab", "down", env=cycle_env)
    assert out.returncode == 0, out.stderr
    assert netns.lab_namespaces(PREFIX) == []
    assert stray.wait(timeout=10) != 0                   # killed by pid, and reaped here (our child)
    assert not any(netns.pid_alive(pid) for pid in agents.values())
    # idempotent: a second down finds nothing and still succeeds
    again = cli("lab", "down", env=cycle_env)
    assert again.returncode == 0 and "nothing to remove" in again.stderr
