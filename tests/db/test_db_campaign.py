"""Campaign state on SQLite and PostgreSQL: a trial is ok only in the transaction that stores its run (and
artifacts' sha256); a failed write leaves it running; resume puts running trials back; a stored run cannot settle
a trial twice; the lease admits one manager at a time, also when two race for it."""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import threading
from dataclasses import replace

import pytest
from sqlalchemy import select

from orchestrator.storage import lease, trials
from orchestrator.storage.campaign_tables import campaign_lease
from orchestrator.storage.db import writer
from orchestrator.storage.run_ingest import IngestError
from orchestrator.storage.writer import write_run


def _night(engine) -> dict:
    trials.save_campaign(engine, "nightly", "c" * 64, "/x/nightly.yaml", "version: 1\n")
    return trials.start_night(engine, "nightly", "c" * 64, "2026-11-26")


def _trial(night: dict, run_id: str, rep: int = 0, variant: str = "vanilla") -> dict:
    return {"campaign_run_id": night["id"], "seq": rep, "cell_key": "k" * 64, "cell_label": "quickstart/main",
            "plan_sha256": "a" * 64, "variant": variant, "repetition": rep, "attempt": 0, "run_id": run_id,
            "spec": {"run_id": run_id}}


def _status(engine, night) -> dict[str, str]:
    return {t["run_id"]: t["status"] for t in trials.trials(engine, [night["id"]])}


def test_trial_settles_with_its_run(engine, make_ingest):
    night = _night(engine)
    trials.add_trials(engine, [_trial(night, "nightly-n1-r0"), _trial(night, "nightly-n1-r1", 1)])
    t = {x["run_id"]: x for x in trials.trials(engine, [night["id"]])}
    assert trials.mark_running(engine, t["nightly-n1-r0"]["id"], "test:1")
    assert not trials.mark_running(engine, t["nightly-n1-r0"]["id"], "test:2")    # no longer pending
    write_run(engine, make_ingest("nightly-n1-r0", n_packets=2_000))
    stored = {x["run_id"]: x for x in trials.trials(engine, [night["id"]])}
    ok = stored["nightly-n1-r0"]
    assert ok["status"] == "ok" and stored["nightly-n1-r1"]["status"] == "pending"
    assert ok["releases"] == {"client": "6.1.0-50-amd64", "aqm": "6.1.0-50-amd64", "server": "6.1.0-50-amd64"}
    assert ok["boot_ids"]["aqm"].startswith("00000001")
    assert sorted(a["name"] for a in ok["artifacts"]) == ["aqm.pcap", "client.pcap"]
    assert all(a["sha256"] == "b" * 64 for a in ok["artifacts"])


def test_failed_write_leaves_the_trial_running_and_resume_requeues_it(engine, make_ingest):
    night = _night(engine)
    trials.add_trials(engine, [_trial(night, "nightly-n1-r0")])
    tid = trials.trials(engine, [night["id"]])[0]["id"]
    trials.mark_running(engine, tid, "test:1")
    bad = make_ingest("nightly-n1-r0", n_packets=2_000)
    bad = replace(bad, flows=[{**bad.flows[0], "cc": None}])      # the write is refused: nothing commits
    with pytest.raises((IngestError, Exception)):
        write_run(engine, bad)
    assert _status(engine, night) == {"nightly-n1-r0": "running"}
    assert trials.requeue_running(engine, night["id"]) == 1
    assert _status(engine, night) == {"nightly-n1-r0": "pending"}


def test_a_settled_trial_is_not_settled_again(engine, make_ingest):
    night = _night(engine)
    trials.add_trials(engine, [_trial(night, "nightly-n1-r0")])
    write_run(engine, make_ingest("nightly-n1-r0", n_packets=1_000, status="failed"))
    assert _status(engine, night) == {"nightly-n1-r0": "failed"}
    write_run(engine, make_ingest("nightly-n1-r0", n_packets=1_000))    # `tcplab ingest` after a fix
    assert _status(engine, night) == {"nightly-n1-r0": "failed"}       # its retry attempt is the sample


def test_metrics_round_trip_with_nan(engine):
    night = _night(engine)
    trials.add_trials(engine, [_trial(night, "nightly-n1-r0")])
    tid = trials.trials(engine, [night["id"]])[0]["id"]
    trials.save_metrics(engine, {tid: {"goodput": 19.1, "jain": float("nan")}})
    got = trials.metrics(engine, [tid])[tid]
    assert got["goodput"] == 19.1 and got["jain"] != got["jain"]


def test_lease_one_holder_at_a_time(engine):
    assert lease.acquire(engine, "nightly", "hostA:1") is None
    other = lease.acquire(engine, "nightly", "hostB:2")
    assert other is not None and other.name == "hostA:1"
    assert lease.renew(engine, "nightly", "hostA:1") and not lease.renew(engine, "nightly", "hostB:2")
    lease.release(engine, "nightly", "hostA:1")
    assert lease.acquire(engine, "nightly", "hostB:2") is None


def test_expired_lease_is_taken_over(engine):
    assert lease.acquire(engine, "nightly", "elsewhere:7", lease_s=-1) is None    # already expired
    assert lease.acquire(engine, "nightly", "hostB:2") is None
    assert lease.current(engine, "nightly").name == "hostB:2"


def test_lease_of_a_dead_local_process_is_taken_over(engine):
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = f"{lease.socket.gethostname()}:{proc.pid}"
    assert lease.acquire(engine, "nightly", dead) is None
    assert lease.acquire(engine, "nightly", f"{lease.socket.gethostname()}:{os.getpid()}") is None
    alive = lease.acquire(engine, "other", f"{lease.socket.gethostname()}:{os.getpid()}")
    assert alive is None
    assert lease.acquire(engine, "other", "hostB:2") is not None       # a live local holder keeps it


def test_two_managers_racing_for_the_lease(engine):
    """Eight threads, each its own connection, try at once after the holder died: exactly one wins."""
    with writer(engine).begin() as conn:
        conn.execute(campaign_lease.insert().values(campaign="nightly", holder="gone:1",
                                                    acquired_at=dt.datetime.now(dt.UTC),
                                                    expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)))
    barrier = threading.Barrier(8)
    results: dict[str, object] = {}

    def contender(i: int) -> None:
        barrier.wait()
        results[f"m{i}:1"] = lease.acquire(engine, "nightly", f"m{i}:1")

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [h for h, r in results.items() if r is None]
    assert len(results) == 8 and len(winners) == 1
    with engine.connect() as conn:
        assert conn.execute(select(campaign_lease.c.holder)).scalar_one() == winners[0]
