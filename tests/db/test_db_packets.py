"""Packets read back through every path: the `packet` view (PostgreSQL) or table (SQLite), packet_store's
numpy read-back, the analysis loaders, and migration 0017 both ways (orchestrator/storage/packet_store.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from alembic import command
from dbdata import make_run_ingest, packets_back, packets_expected
from sqlalchemy import text

from analysis.load import load_packets, load_side_packets
from analysis.rundata import PACKET_DTYPE, SIDE_DTYPE
from orchestrator.ingest.pcap import read_pcap
from orchestrator.storage import packet_store, records
from orchestrator.storage.db import alembic_config
from orchestrator.storage.writer import write_run

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"


def _key(conn, run_id: str) -> int:
    return conn.execute(text("SELECT run_key FROM run WHERE run_id = :r"), {"r": run_id}).scalar_one()


def test_extreme_values_read_back_the_same_through_the_view_and_numpy(engine) -> None:
    ingest = make_run_ingest("x-0001", n_packets=40)
    point, pkts = ingest.packets[0]
    pkts = pkts.copy()
    for i, field in enumerate(records.PACKET_VALUE_FIELDS):
        info = np.iinfo(records.PACKET[field])
        pkts[field][i % 4::4] = [info.min, -1, 0, info.max][i % 4]
    ingest = make_run_ingest("x-0001", n_packets=40)
    ingest = type(ingest)(**{**ingest.__dict__, "packets": [(point, pkts)]})
    write_run(engine, ingest)
    assert packets_back(engine, "x-0001") == packets_expected(ingest)
    with engine.connect() as conn:
        got = packet_store.read_packets(conn, _key(conn, "x-0001"), range(100))
    assert sorted(got[list(records.PACKET_VALUE_FIELDS)].tolist()) == sorted(
        pkts[list(records.PACKET_VALUE_FIELDS)].tolist())
    assert (got["ts_ns"][1:] >= got["ts_ns"][:-1]).all()


def _sql_packets(conn, key: int, point: str, where: str, fields: tuple[str, ...]) -> list[tuple]:
    """The loaders' answer as plain SQL over `packet` joined with `conn` (their query before packet_store)."""
    cols = ", ".join(f"c.{n}" if n in ("src_port", "dst_port") else f"p.{n}" for n in fields)
    sql = (f"SELECT {cols} FROM packet p JOIN conn c ON c.run_key = p.run_key AND c.conn_id = p.conn_id "
           f"WHERE p.run_key = :k AND c.point = :p AND {where}")
    return sorted(tuple(r) for r in conn.execute(text(sql), {"k": key, "p": point}))


def test_loaders_give_what_sql_over_the_packet_view_gives(engine, monkeypatch) -> None:
    """A real capture and the synthetic run: load_packets and load_side_packets return the rows the SQL
    query over `packet` returns, ordered by time, each conn's packets in capture order (read in many parts)."""
    monkeypatch.setattr(packet_store, "READ_BLOCKS", 7)
    monkeypatch.setattr(packet_store, "READ_ROWS", 500)
    real = read_pcap(FIX / "eth.pcap")
    ingest = make_run_ingest("ld-0001", n_packets=30_000, seed=3)
    ingest = type(ingest)(**{**ingest.__dict__, "packets": [*ingest.packets, ("real:eth", real)]})
    write_run(engine, ingest)
    with engine.connect() as conn:
        key = _key(conn, "ld-0001")
        points = conn.execute(text("SELECT DISTINCT point, dst_port FROM conn WHERE run_key = :k"), {"k": key}).all()
        assert len({p for p, _ in points}) == 3
        for point, port in points:
            got = load_packets(conn, key, point, [port])
            assert got.dtype == PACKET_DTYPE and (np.diff(got["ts_ns"]) >= 0).all()
            want = _sql_packets(conn, key, point, f"p.payload_len > 0 AND c.dst_port = {int(port)}", PACKET_DTYPE.names)
            assert sorted(got.tolist()) == want
            side = load_side_packets(conn, key, point, [port])
            want = _sql_packets(conn, key, point, f"(c.dst_port = {int(port)} OR c.src_port = {int(port)})",
                                SIDE_DTYPE.names)
            assert sorted(side.tolist()) == want and (np.diff(side["ts_ns"]) >= 0).all()
        # one conn's packets in capture order
        real_pkts = load_side_packets(conn, key, "real:eth", [5299])
        sent = real[(real["dst_port"] == 5299) & (real["proto"] == records.PROTO_TCP)]
        mine = real_pkts[real_pkts["dst_port"] == 5299]
        assert mine["seq"].tolist() == sent["seq"].tolist() and mine.size > 100


def test_migration_0017_packs_and_unpacks_existing_packets(engine) -> None:
    ingest = make_run_ingest("mg-0001", n_packets=5_000, seed=4)
    write_run(engine, ingest)
    write_run(engine, make_run_ingest("mg-0002", n_packets=300, seed=5))
    want = packets_expected(ingest)
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0016")
    assert packets_back(engine, "mg-0001") == want
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    assert packets_back(engine, "mg-0001") == want
    with engine.connect() as conn:
        got = packet_store.read_packets(conn, _key(conn, "mg-0001"), range(100))
        if engine.dialect.name == "postgresql":   # full blocks of 128 and one tail per conn
            sizes = conn.execute(text("SELECT packets, count(*) FROM packet_block GROUP BY 1")).all()
            assert max(n for n, _ in sizes) == packet_store.BLOCK_PACKETS
    assert got.size == 5_000
    write_run(engine, make_run_ingest("mg-0001", n_packets=50, seed=6))   # the migrated run is replaced
    assert len(packets_back(engine, "mg-0001")) == 50 and len(packets_back(engine, "mg-0002")) == 300
