"""The PostgreSQL packet layout (orchestrator/storage/packet_store.py): blocks of one conn's packets packed as
big-endian records, and their binary COPY rows (orchestrator/storage/pgcopy.py), checked without a database
on the real capture fixtures and on literal values."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest.pcap import read_pcap
from orchestrator.storage import packet_store, pgcopy, records
from orchestrator.storage.conns import ConnRegistry

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"


def _unpack(batches: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(conn id per packet, the packets' RECORD values, block_no per block) in block_no order."""
    blocks = sorted((int(no), int(b["conn_id"][i]), b["rec"][i].tobytes(), int(b["packets"][i]),
                     int(b["ts_first_ns"][i]), int(b["ts_last_ns"][i]))
                    for b in batches for i, no in enumerate(b["block_no"]))
    recs = np.frombuffer(b"".join(r for _, _, r, *_ in blocks), packet_store.RECORD)
    conn = np.repeat([c for _, c, *_ in blocks], [n for *_, n, _, _ in blocks])
    for _, _, raw, n, first, last in blocks:
        ts = np.frombuffer(raw, packet_store.RECORD)["ts_ns"]
        assert ts.size == n <= packet_store.BLOCK_PACKETS and (ts[0], ts[-1]) == (first, last)
    return conn, recs, np.array([no for no, *_ in blocks])


@pytest.mark.parametrize("name", ["eth.pcap", "v6.pcap", "multi_if.pcapng"])
@pytest.mark.parametrize("chunk_rows", [7, 128, 1_000_000])
def test_blocks_of_real_captures_hold_every_packet_of_their_conn_in_capture_order(name, chunk_rows) -> None:
    pkts = read_pcap(FIX / name)
    registry, numbers = ConnRegistry(), packet_store.BlockNumbers()
    ids = registry.ids(pkts)
    batches = []
    for start in range(0, pkts.size, chunk_rows):
        chunk = pkts[start:start + chunk_rows]
        batches += packet_store.block_batches(ids[start:start + chunk_rows], chunk, numbers)
    conn, recs, block_no = _unpack(batches)
    assert block_no.tolist() == list(range(numbers.next))
    assert recs.size == pkts.size
    for cid in np.unique(ids):   # per conn: the same packets, in capture order
        want = pkts[ids == cid]
        got = recs[conn == cid]
        for field in records.PACKET_VALUE_FIELDS:
            assert got[field].tolist() == want[field].tolist(), (cid, field)


def test_a_full_chunk_of_one_conn_makes_full_blocks_and_one_tail() -> None:
    pkts = np.zeros(300, records.PACKET)
    pkts["ts_ns"] = np.arange(300)
    batches = list(packet_store.block_batches(np.zeros(300, np.int32), pkts, packet_store.BlockNumbers()))
    assert sorted((int(b["packets"][0]), b["rec"].shape) for b in batches) == [(44, (1, 44)), (128, (2, 128))]


def test_extreme_values_survive_the_big_endian_record() -> None:
    pkts = np.zeros(4, records.PACKET)
    for field in records.PACKET_VALUE_FIELDS:
        info = np.iinfo(records.PACKET[field])
        pkts[field] = [info.min, -1, 0, info.max]
    (batch,) = packet_store.block_batches(np.full(4, 3, np.int32), pkts, packet_store.BlockNumbers())
    recs = np.frombuffer(batch["rec"].tobytes(), packet_store.RECORD)
    for field in records.PACKET_VALUE_FIELDS:
        assert recs[field].tolist() == pkts[field].tolist()
    # big-endian on the wire: what the view's SQL decodes byte by byte
    offset = packet_store.RECORD.fields["ts_ns"][1] + 3 * packet_store.RECORD.itemsize
    assert batch["rec"].tobytes()[offset:offset + 8] == struct.pack(">q", 2**63 - 1)


def test_bytea_column_copies_a_2d_void_array_as_one_value_per_row() -> None:
    rec = np.frombuffer(b"abcdefgh" * 3, "V4").reshape(3, 2)   # 3 rows of 2 items of 4 bytes
    out = b"".join(pgcopy.encode([("id", "int4"), ("rec", "bytea")], {"id": np.arange(3, dtype=np.int32),
                                                                      "rec": rec}))
    row = struct.pack(">hii", 2, 4, 0) + struct.pack(">i", 8) + b"abcdefgh"
    assert out[:len(row)] == row and len(out) == 3 * len(row)
    with pytest.raises(TypeError, match="void"):
        list(pgcopy.encode([("rec", "bytea")], {"rec": np.arange(3)}))


def test_view_sql_decodes_every_field_with_its_sign() -> None:
    sql = packet_store.VIEW_SQL
    assert sql.startswith("CREATE VIEW packet AS SELECT b.run_key, b.conn_id, ")
    for field in records.PACKET_VALUE_FIELDS:
        assert f" AS {field}" in sql
    assert sql.count("<< 16) >> 16)::smallint") == 2   # tcp_flags, ecn: a bit(16) casts unsigned
