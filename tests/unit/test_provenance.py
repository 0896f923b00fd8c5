"""Run provenance (orchestrator/engine/provenance.py): the pure rules, and the git facts of a real repository."""
from __future__ import annotations

import subprocess

from orchestrator.engine import provenance as pv


def test_pure_rules() -> None:
    assert pv.plan_commit(None, "") is None
    assert pv.plan_commit("abc", "") == "abc"
    assert pv.plan_commit("abc", " M x.yaml\n") == "abc-dirty"
    assert pv.run_by({"TCPLAB_USER": "alice"}, "svc") == "alice"
    assert pv.run_by({}, "svc") == "svc"
    assert pv.testbed_name({}, "physical", "mgr1") == "physical:mgr1"
    assert pv.testbed_name({"TCPLAB_TESTBED": "lab-b"}, "physical", "mgr1") == "lab-b"


def test_columns_pick_the_plans_commit() -> None:
    p = pv.Provenance("alice", "netns:m", "0.1.0", "v0.1-2-gabc", {"plans/a.yaml": "f00"})
    assert p.columns("plans/a.yaml") == {"run_by": "alice", "testbed": "netns:m", "tcplab_version": "0.1.0",
                                         "tcplab_commit": "v0.1-2-gabc", "plan_commit": "f00"}
    assert p.columns("other.yaml")["plan_commit"] is None and p.columns(None)["plan_commit"] is None


def test_plan_commit_of_a_real_repository(tmp_path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    plan = tmp_path / "plan.yaml"
    git("init", "-q")
    plan.write_text("name: p\n")
    git("add", "plan.yaml")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p")
    head = git("rev-parse", "HEAD")
    assert pv.plan_commit_of(plan) == head
    (tmp_path / "unrelated.txt").write_text("x")           # only the plan file's own state counts
    assert pv.plan_commit_of(plan) == head
    plan.write_text("name: p2\n")
    assert pv.plan_commit_of(plan) == head + "-dirty"


def test_collect_once(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TCPLAB_USER", "bob")
    facts = pv.collect("netns", [tmp_path / "nowhere.yaml"])
    assert facts.run_by == "bob" and facts.testbed.startswith("netns:")
    assert facts.tcplab_version and facts.tcplab_commit    # a checkout: git describe; else the version
