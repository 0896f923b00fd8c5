"""`tcplab study run` for real on the netns lab (tests/plans/study/: six 3 s runs): it brings up the lab its
profile names under its own prefix, runs the selected runs, writes the page and the CSV with a verdict per cell
(within and out of tolerance, no paper value, and not reproducible for the arms the profile runs identically),
takes the lab it started down, and a second run stores nothing new."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.lab.conftest import lab_unavailable

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "tests" / "plans" / "study" / "study.yaml"
PREFIX = "tstudy"



def _study(action: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TCPLAB_LAB_DIR": str(tmp / "lab"), "TCPLAB_LAB_PREFIX": PREFIX, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "study", action, str(STUDY), "--db",
                           f"sqlite:///{tmp / 'study.db'}", "--out", str(tmp / "out"), "--results",
                           str(tmp / "results")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    if reason := lab_unavailable():
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("study")
    try:
        done = _study("run", tmp)
        yield tmp, done
    finally:
        env = {**os.environ, "TCPLAB_LAB_DIR": str(tmp / "lab"), "TCPLAB_LAB_PREFIX": PREFIX}
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "lab", "down"], env=env, cwd=ROOT,
                       capture_output=True, timeout=120)


def _cells(tmp: Path) -> dict[tuple[str, str], dict]:
    with (tmp / "out" / "study-tiny-study.csv").open() as f:
        return {(r["row"], r["column"]): r for r in csv.DictReader(f)}


def test_the_study_runs_its_runs_and_judges_every_cell(ran):
    tmp, done = ran
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "NOT REPRODUCIBLE HERE: old against new kernel" in said, said[-3000:]
    with create_engine(f"sqlite:///{tmp / 'study.db'}").connect() as c:
        assert c.execute(text("SELECT status, count(*) FROM run GROUP BY status")).all() == [("complete", 6)]
    cells = _cells(tmp)
    reno_one = cells["reno", "one"]
    assert reno_one["verdict"] == "within tolerance" and 17.0 < float(reno_one["measured"]) <= 20.0
    assert cells["reno", "two"]["verdict"] == "out of tolerance"       # the paper's 5 Mbit/s: a test value
    assert {cells["cubic old", c]["verdict"] for c in ("one", "two")} == {"not reproducible here"}
    assert "the profile gives new and old the same kernel" in cells["cubic old", "one"]["why"]
    assert (cells["reno flows", "two"]["verdict"], cells["reno flows", "two"]["measured"]) == ("no paper value",
                                                                                             "1.0")
    page = (tmp / "out" / "study-tiny-study.html").read_text()
    assert "Not reproducible on this testbed" in page and page.count("data:image/png;base64,") == 1


def test_the_lab_the_study_started_is_down_and_a_second_run_stores_nothing_new(ran):
    tmp, _ = ran
    assert not (tmp / "lab" / "inventory.json").exists()
    again = _study("run", tmp)
    assert again.returncode == 0, again.stdout[-3000:]
    said = again.stdout + again.stderr
    assert "6 of 6 runs already complete in the DB; skipping them" in said, said[-2000:]
    with create_engine(f"sqlite:///{tmp / 'study.db'}").connect() as c:
        assert c.execute(text("SELECT count(*) FROM run")).scalar() == 6
