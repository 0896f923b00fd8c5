"""Campaigns on the netns lab, through the real CLI (`tcplab campaign run|resume|verdict|report`): the same variant
on both sides passes (exit 0); a ten times longer queue is a queue-delay REGRESSION (exit 1) while goodput passes;
a manager killed with SIGKILL in the middle of a night is resumed with no trial lost or duplicated, its lease is
taken over at once, and a second manager meanwhile is refused."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

CAMPAIGNS = Path(__file__).resolve().parents[1] / "plans" / "campaign"
TCPLAB = str(Path(sys.executable).parent / "tcplab")


def _tcplab(args: list[str], lab_state: Path, tmp_path: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([TCPLAB, *args, "--db", f"sqlite:///{tmp_path}/c.db", *_where(lab_state, tmp_path, args)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def _where(lab_state: Path, tmp_path: Path, args: list[str]) -> list[str]:
    if args[1] in ("run", "resume"):
        return ["--inventory", str(lab_state / "inventory.json"), "--results", str(tmp_path / "results")]
    return []


def _trials(tmp_path: Path) -> list[dict]:
    engine = create_engine(f"sqlite:///{tmp_path}/c.db")
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(
            "SELECT cell_key, variant, repetition, attempt, status, run_id FROM trial ORDER BY id"))]
    engine.dispose()
    return rows


def _verdicts(tmp_path: Path) -> dict[str, str]:
    engine = create_engine(f"sqlite:///{tmp_path}/c.db")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT metric, verdict FROM campaign_verdict")).all()
    engine.dispose()
    return dict(rows)


def test_same_variant_on_both_sides_passes(lab, tmp_path):
    _, state = lab
    r = _tcplab(["campaign", "run", str(CAMPAIGNS / "tiny-aa.yaml")], state, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    verdicts = _verdicts(tmp_path)
    assert set(verdicts) == {"goodput", "qdelay_median"} and "REGRESSION" not in verdicts.values(), verdicts
    assert all(t["status"] == "ok" for t in _trials(tmp_path))


def test_longer_queue_is_a_regression_and_resume_after_kill(lab, tmp_path):
    _, state = lab
    cmd = [TCPLAB, "campaign", "run", str(CAMPAIGNS / "tiny.yaml"), "--db", f"sqlite:///{tmp_path}/c.db",
           *_where(state, tmp_path, ["campaign", "run"])]
    first = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:   # wait until some trials are ok and one is running
            time.sleep(0.5)
            if not (tmp_path / "c.db").exists():
                continue
            try:
                ts = _trials(tmp_path)
            except Exception:   # the schema may not be there yet
                continue
            if sum(t["status"] == "ok" for t in ts) >= 3 and any(t["status"] == "running" for t in ts):
                break
        else:
            raise AssertionError("the campaign did not get going in 300 s")
        busy = _tcplab(["campaign", "run", str(CAMPAIGNS / "tiny.yaml")], state, tmp_path, timeout=120)
        assert busy.returncode == 2 and f"is run by {os.uname().nodename}:{first.pid}" in busy.stderr, busy.stderr
        time.sleep(1.0)   # into the running trial's flows
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    before = _trials(tmp_path)
    ok_before = {t["run_id"] for t in before if t["status"] == "ok"}
    assert any(t["status"] == "running" for t in before)
    resumed = _tcplab(["campaign", "resume", str(CAMPAIGNS / "tiny.yaml")], state, tmp_path)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "resuming night 1" in resumed.stderr
    after = _trials(tmp_path)
    assert ok_before <= {t["run_id"] for t in after if t["status"] == "ok"}      # nothing ok is lost or rerun
    slots = [(t["cell_key"], t["variant"], t["repetition"]) for t in after if t["status"] == "ok"]
    assert len(slots) == len(set(slots)), "a repetition has two ok trials"
    assert all(t["status"] in ("ok", "failed") for t in after)                    # nothing left pending/running
    reps = {v: sum(1 for s in slots if s[1] == v) for v in ("vanilla", "long-queue")}
    assert reps["vanilla"] == reps["long-queue"] >= 4
    engine = create_engine(f"sqlite:///{tmp_path}/c.db")
    with engine.connect() as conn:    # every stored run belongs to one trial, no trial's run is missing
        runs = {r[0]: r[1] for r in conn.execute(text("SELECT run_id, status FROM run"))}
    engine.dispose()
    assert set(runs) == {t["run_id"] for t in after if t["status"] in ("ok", "failed")}
    verdicts = _verdicts(tmp_path)
    assert verdicts == {"goodput": "PASS", "qdelay_median": "REGRESSION"}, verdicts
    v = _tcplab(["campaign", "verdict", str(CAMPAIGNS / "tiny.yaml")], state, tmp_path)
    assert v.returncode == 1 and "REGRESSION" in v.stderr
    rep = _tcplab(["campaign", "report", "tiny-queue", "--out", str(tmp_path / "report")], state, tmp_path)
    page = (tmp_path / "report" / "campaign-tiny-queue.html").read_text()
    assert rep.returncode == 0 and "REGRESSION" in page and "data:image/png;base64" in page
