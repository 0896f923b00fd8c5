"""The pure parts of failure handling: which artifact names the manager accepts, the run marker's round trip
and what counts as unfinished or pending, the supervisor's restart budget, a full artifacts disk."""
from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from agents.taskbase import artifacts_disk_full
from orchestrator.agent_client import artifact_name_problem
from orchestrator.engine import marker
from orchestrator.engine.recovery import pending_ingests
from orchestrator.lab.supervisor import MAX_RESTARTS, RESTART_WINDOW_S, restart_allowed


@pytest.mark.parametrize("name", ["capture-to-client.pcap", "iperf3-client-5201.json", "a", "x" * 200, "é.pcap"])
def test_plain_file_names_are_accepted(name):
    assert artifact_name_problem(name) is None


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b", "a\x00b", ".part", "x" * 201, 5, None])
def test_names_that_are_not_one_plain_file_name_are_refused(name):
    assert artifact_name_problem(name)


def test_marker_round_trip_and_phases(tmp_path):
    run = tmp_path / "plan-main-abc-r0"
    run.mkdir()
    started = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    plan = {"plan_sha256": "s", "name": "plan", "created_at": started}
    marker.write(run, marker.RUNNING, started, ["client", "aqm"], plan)
    m = marker.read(run)
    assert (m.phase, m.pid, m.started_at, m.hosts, m.plan) == (marker.RUNNING, os.getpid(), started,
                                                                 ["client", "aqm"], plan)
    assert not marker.writer_alive(m)          # this process is never "another live manager"
    marker.write(run, marker.INGEST, started, ["client"], None)
    assert marker.read(run).phase == marker.INGEST and [u.run_id for u in marker.unfinished(tmp_path)] == [run.name]
    marker.clear(run)
    assert marker.read(run) is None and marker.unfinished(tmp_path) == []


def test_a_torn_marker_still_marks_the_run_unfinished(tmp_path):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / marker.MARKER_FILE).write_text('{"phase": "runn')
    assert [(m.run_id, m.phase) for m in marker.unfinished(tmp_path)] == [("r1", marker.RUNNING)]


def test_a_live_writer_is_seen_alive(tmp_path):
    m = marker.RunMarker(tmp_path, marker.RUNNING, os.getppid(), dt.datetime.now(dt.UTC), [], None)
    assert marker.writer_alive(m)
    assert not marker.writer_alive(marker.RunMarker(tmp_path, marker.RUNNING, 2**22 + 12345,
                                                    dt.datetime.now(dt.UTC), [], None))


def test_pending_ingests_are_ingest_phase_markers_or_records_not_in_the_db(tmp_path):
    now = dt.datetime.now(dt.UTC)
    for name in ("stored", "not-stored", "ingest-phase", "running-phase"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ingest.json").write_text(json.dumps({}))
    marker.write(tmp_path / "ingest-phase", marker.INGEST, now, [], None)
    marker.write(tmp_path / "running-phase", marker.RUNNING, now, [], None)
    (tmp_path / "no-record").mkdir()
    got = [p.name for p in pending_ingests(tmp_path, stored={"stored", "ingest-phase", "running-phase"})]
    assert got == ["ingest-phase", "not-stored"]


def test_restart_budget():
    assert restart_allowed([], 100.0)
    recent = [100.0 - i for i in range(MAX_RESTARTS)]
    assert not restart_allowed(recent, 100.5)
    assert restart_allowed(recent, 100.0 + RESTART_WINDOW_S + 1)


def test_a_directory_with_room_is_not_full(tmp_path):
    assert not artifacts_disk_full(tmp_path) or os.statvfs(tmp_path).f_bavail == 0
