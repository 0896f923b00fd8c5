"""Guards that need a run's packets, run over the rows just written. The pcap hot path builds no object per
packet, so these read aggregates back with one GROUP BY per run and add their findings to the run's flags.
Called by the run engine and by `tcplab ingest`, so a re-ingest redoes them."""
from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import Engine

from orchestrator.engine import guards
from orchestrator.plan import RunSpec
from orchestrator.storage import tables as T
from orchestrator.storage.ingest import RunIngest

SYN, ACK, ECE, CWR = 0x02, 0x10, 0x40, 0x80


def _count(cond) -> sa.ColumnElement:
    return sa.func.sum(sa.case((cond, 1), else_=0))


def handshake_ecn_counts(engine: Engine, run_id: str) -> list[dict]:
    """Per (capture point, connection): SYNs, SYNs with ECE+CWR, SYN-ACKs, SYN-ACKs with ECE, data packets and
    ECN-capable (ECT or CE) data packets."""
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
            .group_by(c.c.point, c.c.src_port, c.c.dst_port))
    with engine.connect() as conn:
        return [{k: (int(v) if k != "point" else v) for k, v in row._mapping.items()} for row in conn.execute(stmt)]


def flag_written_run(engine: Engine, ingest: RunIngest) -> list[str]:
    """Findings over the written packets (G-ECN post), added to the stored run's flags; returns the flags
    added."""
    run = ingest.run
    if run.get("status") != "complete" or not ingest.packets:
        return []
    spec = RunSpec.model_validate(run["spec"])
    if not any(f.tool != "udp" and guards.ecn_expected(spec, f) for f in spec.flows):
        return []   # no flow asked for ECN: spare the database a GROUP BY over every packet of the run
    found = [str(f) for f in guards.ecn_findings(spec, ingest.flows, handshake_ecn_counts(engine, run["run_id"]))]
    with engine.begin() as conn:
        where = T.run.c.run_id == run["run_id"]
        stored = list(conn.execute(sa.select(T.run.c.flags).where(where)).scalar_one() or [])
        new = [f for f in found if f not in stored]
        if new:
            conn.execute(sa.update(T.run).where(where).values(flags=[*stored, *new]))
    return new
