"""The lab writes its inventory as Ansible INI too; that file loads back equal and drives a real run."""
from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator.agent_client import AgentClient
from orchestrator.inventory import load_inventory
from orchestrator.inventory_ini import without_lab_bookkeeping
from orchestrator.lab import netns

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"
TCPLAB = Path(sys.executable).parent / "tcplab"


def test_the_labs_ini_loads_through_ansible_equal_to_its_json(lab):
    _, state_dir = lab
    from_json = load_inventory(netns.inventory_path(state_dir))
    from_ini = load_inventory(state_dir / "inventory.ini")
    assert from_ini == without_lab_bookkeeping(from_json)
    assert from_json.supervisor_pid and from_ini.supervisor_pid is None     # bookkeeping stays in the JSON

    async def hello_all() -> list[str]:
        names = []
        for role, host in from_ini.hosts.items():
            client = AgentClient(role, host.agent, from_ini.token)
            await client.connect("tcplab-ini-test")
            names.append(role)
            await client.close()
        return names

    assert asyncio.run(hello_all()) == ["client", "aqm", "server"]


def test_tcplab_run_with_the_ini_inventory_completes_a_run(lab, tmp_path):
    """`tcplab run PLAN --inventory <state>/inventory.ini`: one short quickstart run, end to end."""
    _, state_dir = lab
    plan = yaml.safe_load(QUICKSTART.read_text())
    plan["name"] = "ini-inventory"
    plan["run"]["duration"] = "2s"
    plan["matrix"]["axes"] = {"traffic.cc": ["reno"]}
    for key in ("captures", "qdisc_stats", "tcp_probe"):
        plan["run"].pop(key)
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan))
    db = tmp_path / "tcplab.db"
    out = subprocess.run([str(TCPLAB), "run", str(plan_file), "--inventory", str(state_dir / "inventory.ini"),
                          "--db", f"sqlite:///{db}", "--results", str(tmp_path / "results")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM run WHERE status = 'complete'").fetchone() == (1,)
