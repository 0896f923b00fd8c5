"""G-ECN post on the netns lab: the engine reads the handshake and the data's ECN codepoints back from the
written packets. A sender asking for ECN (tcp_ecn = 1) whose receiver does not answer (tcp_ecn = 0) is
flagged; with both ends willing the same run is clean. The same aggregate query runs on PostgreSQL."""
from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text

from orchestrator.engine.written import flag_written_run, handshake_ecn_counts
from orchestrator.ingest.assemble import reassemble
from orchestrator.storage.db import open_db
from orchestrator.storage.ingest import write_run
from tests.lab.conftest import one_flow_plan, run_lab_plan

PLAN = one_flow_plan("ecn-RECEIVER", "ECN requested by the sender; the receiver's tcp_ecn is RECEIVER",
                     hosts="    server:\n      sysctls: {net.ipv4.tcp_ecn: 1, net.ipv4.tcp_ecn_fallback: 0}\n"
                           "    client:\n      sysctls: {net.ipv4.tcp_ecn: RECEIVER}\n")


def _run(lab, tmp_path: Path, receiver: int):
    _, state_dir = lab
    plan = tmp_path / f"ecn-{receiver}.yaml"
    plan.write_text(PLAN.replace("RECEIVER", str(receiver)))
    engine = run_lab_plan(plan, state_dir, tmp_path)
    with engine.connect() as conn:
        [run] = conn.execute(text("SELECT run_id, status, flags FROM run")).all()
    assert run.status == "complete"
    return engine, run.run_id, json.loads(run.flags)


def test_receiver_without_ecn_is_flagged(lab, tmp_path, pg_url):
    engine, run_id, flags = _run(lab, tmp_path, receiver=0)
    ecn = [f for f in flags if f.startswith("G-ECN")]
    print("\n".join(ecn))
    assert len(ecn) == 1, flags
    assert ecn[0].startswith("G-ECN host server: flow 0 (")
    assert "the SYN-ACK carried no ECE" in ecn[0] and "0% of its data packets" in ecn[0]
    assert "its SYN carried no ECE+CWR" not in ecn[0]          # the sender did ask
    sqlite_counts = sorted(handshake_ecn_counts(engine, run_id), key=lambda c: (c["point"], c["src_port"]))
    # the same aggregate and the same flag on PostgreSQL, through `tcplab ingest`'s path
    pg = open_db(pg_url)
    ingest = reassemble(tmp_path / "results" / run_id)
    write_run(pg, ingest)
    assert flag_written_run(pg, ingest) == ecn
    assert sorted(handshake_ecn_counts(pg, run_id), key=lambda c: (c["point"], c["src_port"])) == sqlite_counts
    assert flag_written_run(pg, ingest) == []                   # already recorded: not added twice


def test_ecn_on_both_ends_is_clean(lab, tmp_path):
    engine, run_id, flags = _run(lab, tmp_path, receiver=1)
    assert not [f for f in flags if f.startswith("G-ECN")], flags
    counts = handshake_ecn_counts(engine, run_id)
    data = max(counts, key=lambda c: c["data"])
    assert data["data_ect"] / data["data"] > 0.95 and sum(c["syn_ecn"] for c in counts) >= 1
