"""G-ECN post on the netns lab: the ECN tally folds over the packets while the writer streams them, and the
run row is written with its flag. A sender asking for ECN (tcp_ecn = 1) whose receiver does not answer
(tcp_ecn = 0) is flagged; with both ends willing the same run is clean. The fold's counts are checked against
an independent GROUP BY over the written rows, on SQLite and on PostgreSQL (`tcplab ingest`'s path)."""
from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from orchestrator.guards.ecn import ACK, CWR, ECE, SYN, EcnTally
from orchestrator.guards.finalise import finalise_run
from orchestrator.ingest.record import RunRecord
from orchestrator.plan import RunSpec
from orchestrator.storage import tables as T
from orchestrator.storage.db import open_db
from tests.lab.conftest import one_flow_plan, run_lab_plan, stored_flags

PLAN = one_flow_plan("ecn-RECEIVER", "ECN requested by the sender; the receiver's tcp_ecn is RECEIVER",
                     hosts="    server:\n      sysctls: {net.ipv4.tcp_ecn: 1, net.ipv4.tcp_ecn_fallback: 0}\n"
                           "    client:\n      sysctls: {net.ipv4.tcp_ecn: RECEIVER}\n")


def _count(cond) -> sa.ColumnElement:
    return sa.func.sum(sa.case((cond, 1), else_=0))


def sql_ecn_counts(engine, run_id: str) -> list[dict]:
    """The oracle: the tally's six counters per (capture point, ports), by SQL over the written packets."""
    p, c = T.packet, T.conn
    flags = p.c.tcp_flags
    stmt = (sa.select(c.c.point, c.c.src_port, c.c.dst_port,
                      _count(flags.op("&")(SYN | ACK) == SYN).label("syn"),
                      _count((flags.op("&")(SYN | ACK | ECE | CWR)) == SYN | ECE | CWR).label("syn_ecn"),
                      _count(flags.op("&")(SYN | ACK) == SYN | ACK).label("synack"),
                      _count(flags.op("&")(SYN | ACK | ECE) == SYN | ACK | ECE).label("synack_ece"),
                      _count(p.c.payload_len > 0).label("data"),
                      _count(sa.and_(p.c.payload_len > 0, p.c.ecn != 0)).label("data_ect"))
            .select_from(p.join(c, sa.and_(c.c.run_key == p.c.run_key, c.c.conn_id == p.c.conn_id)))
            .where(p.c.run_key == sa.select(T.run.c.run_key).where(T.run.c.run_id == run_id).scalar_subquery())
            .where(c.c.proto == 6)
            .group_by(c.c.point, c.c.src_port, c.c.dst_port)
            .order_by(c.c.point, c.c.src_port, c.c.dst_port))
    with engine.connect() as conn:
        return [{k: (int(v) if k != "point" else v) for k, v in row._mapping.items()} for row in conn.execute(stmt)]


def _run(lab, tmp_path: Path, receiver: int):
    _, state_dir = lab
    plan = tmp_path / f"ecn-{receiver}.yaml"
    plan.write_text(PLAN.replace("RECEIVER", str(receiver)))
    engine = run_lab_plan(plan, state_dir, tmp_path)
    [(run_id, flags)] = stored_flags(engine).items()
    return engine, run_id, flags


def _tally(run_dir: Path) -> EcnTally:
    """The tally as finalise_run builds it, fed by streaming the run's captures once more."""
    from orchestrator.ingest.assemble import assemble

    record = RunRecord.load(run_dir)
    spec = RunSpec.model_validate(record.run["spec"])
    ingest = assemble(spec, record, run_dir)
    tally = EcnTally(spec, ingest.flows)
    for label, reader in ingest.packets:
        for chunk in reader:
            tally.observe(label, chunk)
    return tally


def test_receiver_without_ecn_is_flagged(lab, tmp_path, pg_url):
    engine, run_id, flags = _run(lab, tmp_path, receiver=0)
    ecn = [f for f in flags if f.guard == "G-ECN"]
    print("\n".join(map(str, ecn)))
    assert len(ecn) == 1, flags
    assert ecn[0].host == "server" and ecn[0].message.startswith("flow 0 (")
    assert "the SYN-ACK carried no ECE" in ecn[0].message and "0% of its data packets" in ecn[0].message
    assert "its SYN carried no ECE+CWR" not in ecn[0].message          # the sender did ask
    run_dir = tmp_path / "results" / run_id
    assert _tally(run_dir).counts() == sql_ecn_counts(engine, run_id)
    # `tcplab ingest`'s path into PostgreSQL: the same flag, written once however often it is re-ingested
    pg = open_db(pg_url)
    for _ in range(2):
        outcome = finalise_run(pg, run_dir, RunRecord.load(run_dir))
        assert [f for f in outcome.flags if f.guard == "G-ECN"] == ecn
        assert stored_flags(pg)[run_id] == stored_flags(engine)[run_id]
    assert sql_ecn_counts(pg, run_id) == sql_ecn_counts(engine, run_id)


def test_ecn_on_both_ends_is_clean(lab, tmp_path):
    engine, run_id, flags = _run(lab, tmp_path, receiver=1)
    assert not [f for f in flags if f.guard == "G-ECN"], flags
    counts = _tally(tmp_path / "results" / run_id).counts()
    assert counts == sql_ecn_counts(engine, run_id)
    data = max(counts, key=lambda c: c["data"])
    assert data["data_ect"] / data["data"] > 0.95 and sum(c["syn_ecn"] for c in counts) >= 1
