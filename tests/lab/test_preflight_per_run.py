"""Preflight per run on the netns lab (issue 14.5): a plan with a cell the lab can run (pfifo) and one it cannot
(fq_codel, absent from this machine's kernel). `--dry-run` lists both without touching a host or a database, a
second dry run works from the capability cache alone, and a real run completes the one and records the other
as `refused` with its reason (exit code 3)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from sqlalchemy import text

from orchestrator.engine import capcache
from orchestrator.engine.selection import RunFilter
from orchestrator.lab import netns
from orchestrator.storage.db import open_db
from tests.lab.conftest import TEST_PREFIX, one_flow_plan, tcplab_run

EXPERIMENTS = """experiments:
  - name: fifo
  - name: codel
    set: {bottleneck.queue: {kind: fq_codel}}
"""


def kernel_has(qdisc: str) -> bool:
    ns = f"{TEST_PREFIX}-qprobe"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        return subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", qdisc],
                              capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def aqm_view(inv) -> str:
    host = inv.hosts["aqm"]
    return subprocess.run(["ip", "netns", "exec", host.namespace, "tc", "-j", "qdisc", "show", "dev",
                           host.iface_toward("client")], capture_output=True, text=True, check=True).stdout


def test_dry_run_then_real_run_refuse_one_cell_and_run_the_other(lab, tmp_path):
    inv, state_dir = lab
    if kernel_has("fq_codel"):
        pytest.skip(f"kernel {os.uname().release} has fq_codel: nothing to refuse here")
    plan = tmp_path / "mixed.yaml"
    plan.write_text(one_flow_plan("mixed", "one runnable cell, one refused", run_extra="") + EXPERIMENTS)
    results, db_file = tmp_path / "results", tmp_path / "lab.db"
    url, inventory = f"sqlite:///{db_file}", netns.inventory_path(state_dir)
    before = aqm_view(inv)

    rc, said = tcplab_run(plan, inventory, results, url, dry=True)
    assert rc == 3, said
    assert "asking the agents (hello only)" in said
    assert said.count("runnable") >= 1 and "mixed-fifo-" in said
    assert f"refused: host aqm (kernel {os.uname().release}) lacks qdisc fq_codel" in said
    assert "2 runs: 1 runnable, 1 refused" in said
    assert aqm_view(inv) == before and not db_file.exists()
    assert not any(results.glob("*/runspec.json"))
    assert set(capcache.load(results)) == set(inv.hosts)

    # the cache alone: an inventory whose token cannot be read would fail any connection
    offline = tmp_path / "offline-inventory.json"
    offline.write_text(json.dumps({**json.loads(inventory.read_text()), "token_file": str(tmp_path / "no-token")}))
    rc, said = tcplab_run(plan, offline, results, url, dry=True)
    assert rc == 3, said
    assert "no agent contacted" in said and "2 runs: 1 runnable, 1 refused" in said
    rc, said = tcplab_run(plan, offline, results, url, dry=True, filters=RunFilter(experiments=("fifo",)))
    assert rc == 0 and "1 runs: 1 runnable, 0 refused" in said

    rc, said = tcplab_run(plan, inventory, results, url)
    assert rc == 3, said
    assert "2 runs: 1 complete, 0 failed, 1 refused" in said
    with open_db(url).connect() as conn:
        rows = {r.experiment: r for r in conn.execute(text("SELECT experiment, run_id, status, error FROM run"))}
    assert rows["fifo"].status == "complete"
    assert rows["codel"].status == "refused"
    assert rows["codel"].error == ("refused before touching any host: host aqm (kernel "
                                   f"{os.uname().release}) lacks qdisc fq_codel")
    assert not (results / rows["codel"].run_id).exists()      # nothing was written for it, no host touched
    assert aqm_view(inv) == before

    # again: the complete run is skipped, the refused one is judged again (it runs once the testbed can)
    rc, said = tcplab_run(plan, inventory, results, url)
    assert rc == 3, said
    assert "1 of 2 runs already complete in the DB; skipping them" in said
    assert "1 runs: 0 complete, 0 failed, 1 refused (1 already complete, skipped)" in said
