"""The packet layout in the database and its read-back: the one place that knows how packets are stored.

PostgreSQL keeps packets in **blocks**: one `packet_block` row holds up to BLOCK_PACKETS consecutive packets
of one conn as a packed big-endian record array (RECORD, 56 bytes a packet) in a bytea, plus the block's
first and last timestamps. The backend's cost per COPY row and per field (docs/ingest.md: ~0.4 µs a tuple,
~0.1 µs a column) is paid once per block instead of once per packet, and the bytea is one memcpy for it.
A block of 128 packets is a 7.3 kB tuple; the partitions are made with toast_tuple_target = 8160 and the
bytea with STORAGE EXTERNAL, so a block stays in its heap page and is never compressed (pglz would cost
more CPU than the whole COPY).

The view `packet` (VIEW_SQL, created by migration 0017) unnests the blocks in SQL, so `tcplab query` and
any SQL written against the row-per-packet table still see one row per packet with the same columns and
types. Bulk readers do not go through it: `read_packets` fetches the blocks of the wanted conns and
decodes them with numpy. SQLite keeps one row per packet in the `packet` table (its writer cost is per
row either way), and `read_packets` reads it there: callers never see the difference.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.storage import records, tables

BLOCK_PACKETS = 128   # 128 x 56 B + headers fits one 8 kB heap page (toast_tuple_target 8160)
RECORD = np.dtype([(n, records.PACKET.fields[n][0].newbyteorder(">")) for n in records.PACKET_VALUE_FIELDS])
# Storage parameters of every packet_block partition (orchestrator/storage/bulk.py creates them).
PARTITION_WITH = "toast_tuple_target = 8160"
PARTITION_DDL = ("ALTER TABLE {name} ALTER COLUMN rec SET STORAGE EXTERNAL",)

_SQL_INT = {8: ("bit(64)", "bigint"), 4: ("bit(32)", "integer"), 2: ("bit(16)", "smallint")}


def _decode_sql(name: str) -> str:
    """SQL for one field of packet k of block b: its bytes as hex, cast through a bit string.
    A bit(16) casts to integer unsigned, so smallints are sign-extended by the shift pair."""
    offset, width = RECORD.fields[name][1], RECORD.fields[name][0].itemsize
    bits, sql_type = _SQL_INT[width]
    raw = f"('x' || encode(substr(b.rec, k * {RECORD.itemsize} + {offset + 1}, {width}), 'hex'))::{bits}"
    if width == 2:
        return f"((({raw})::integer << 16) >> 16)::smallint AS {name}"
    return f"{raw}::{sql_type} AS {name}"


VIEW_SQL = (
    "CREATE VIEW packet AS SELECT b.run_key, b.conn_id, "
    + ", ".join(_decode_sql(c.name) for c in tables.packet.columns if c.name in RECORD.names)
    + " FROM packet_block b CROSS JOIN LATERAL generate_series(0, b.packets - 1) AS i(k)"
)


def stored_as_blocks(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def table(conn: Connection) -> sa.Table:
    """The table the writer loads packets into on this connection's backend."""
    return tables.packet_block if stored_as_blocks(conn) else tables.packet


# --- writing -----------------------------------------------------------------------------------------

def row_batch(conn_ids: np.ndarray, chunk: np.ndarray) -> dict[str, Any]:
    """One packet row per packet (SQLite): conn_id and the value fields of a records.PACKET chunk."""
    return {"conn_id": conn_ids, **{n: chunk[n] for n in records.PACKET_VALUE_FIELDS}}


class BlockNumbers:
    """Running block_no of one run's packet_block rows (their write order, which read-back restores)."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> np.ndarray:
        out = np.arange(self.next, self.next + count, dtype=np.int32)
        self.next += count
        return out


def block_batches(conn_ids: np.ndarray, chunk: np.ndarray, numbers: BlockNumbers) -> Iterator[dict[str, Any]]:
    """packet_block rows of one records.PACKET chunk: its packets grouped by conn (capture order kept
    within a conn), cut into blocks of at most BLOCK_PACKETS. Blocks of equal length share a batch, whose
    `rec` is a (blocks, length) array of one void record type: a fixed-width bytea for
    orchestrator/storage/pgcopy.py."""
    if chunk.size == 0:
        return
    rec = np.empty(chunk.size, RECORD)
    for name in RECORD.names:    # field by field: strided copies with the byte swap, no gather
        rec[name] = chunk[name]
    # one gather of whole records (a void type moves as bytes, many times faster than a structured gather);
    # conn ids of one run fit 16 bits, where numpy's stable sort is a radix sort
    key = conn_ids.astype(np.uint16) if conn_ids.max() < 2**16 else conn_ids
    order = np.argsort(key, kind="stable")
    packed = rec.view(f"V{RECORD.itemsize}")[order]
    ids, ts = conn_ids[order], chunk["ts_ns"][order]
    conn_start = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    conn_len = np.diff(np.r_[conn_start, ids.size])
    per_conn = -(-conn_len // BLOCK_PACKETS)
    # block starts: each conn's start plus multiples of BLOCK_PACKETS within it
    within = np.arange(per_conn.sum()) - np.repeat(np.cumsum(per_conn) - per_conn, per_conn)
    starts = np.repeat(conn_start, per_conn) + within * BLOCK_PACKETS
    lengths = np.minimum(BLOCK_PACKETS, np.repeat(conn_start + conn_len, per_conn) - starts)
    block_no = numbers.take(starts.size)
    for n in np.unique(lengths).tolist():
        first = starts[lengths == n]
        yield {"conn_id": ids[first], "block_no": block_no[lengths == n], "packets": np.full(first.size, n, np.int16),
               "ts_first_ns": ts[first], "ts_last_ns": ts[first + n - 1],
               "rec": packed[first[:, None] + np.arange(n)]}


# --- reading -----------------------------------------------------------------------------------------

def read_packets(conn: Connection, run_key: int | None, conn_ids: Sequence[int],
                 fields: Sequence[str] = records.PACKET_VALUE_FIELDS) -> np.ndarray:
    """Packets of the given conns of a run: a structured array of conn_id and `fields` (native byte order,
    the records.PACKET widths), ordered by ts_ns; packets of one conn with equal ts_ns stay in capture
    order. Streamed a part at a time: at most one part's rows are Python objects."""
    dtype = np.dtype([("conn_id", "i4"), *((n, records.PACKET.fields[n][0]) for n in fields)])
    ids = [int(i) for i in conn_ids]
    if run_key is None or not ids:
        return np.empty(0, dtype)
    if stored_as_blocks(conn):
        b = tables.packet_block
        stmt = (sa.select(b.c.conn_id, b.c.packets, b.c.rec).where(b.c.run_key == run_key, b.c.conn_id.in_(ids))
                .order_by(b.c.block_no))
        parts = [_decode_blocks(rows, dtype) for rows in _parts(conn, stmt, READ_BLOCKS)]
    else:
        p = tables.packet
        stmt = (sa.select(p.c.conn_id, *(p.c[n] for n in fields))
                .where(p.c.run_key == run_key, p.c.conn_id.in_(ids)).order_by(p.c.ts_ns))
        parts = [_columns(rows, dtype) for rows in _parts(conn, stmt, READ_ROWS)]
    out = np.concatenate(parts) if parts else np.empty(0, dtype)
    if stored_as_blocks(conn) and "ts_ns" in dtype.names:   # blocks come by conn; SQLite sorted already
        out = out[np.argsort(out["ts_ns"], kind="stable")]
    return out


READ_BLOCKS, READ_ROWS = 2_000, 100_000   # blocks (<= 256 k packets) / rows fetched at a time


def _parts(conn: Connection, stmt: sa.Select, size: int) -> Iterator[list[Any]]:
    yield from conn.execution_options(stream_results=True).execute(stmt).partitions(size)


def _decode_blocks(rows: list[Any], dtype: np.dtype) -> np.ndarray:
    conn_col, counts, recs = zip(*rows, strict=True)
    rec = np.frombuffer(b"".join(recs), RECORD)
    out = np.empty(rec.size, dtype)
    out["conn_id"] = np.repeat(np.asarray(conn_col, np.int32), np.asarray(counts, np.int64))
    for name in dtype.names[1:]:
        out[name] = rec[name]
    return out


def _columns(rows: list[Any], dtype: np.dtype) -> np.ndarray:
    out = np.empty(len(rows), dtype)
    for name, column in zip(dtype.names, zip(*rows, strict=True), strict=True):
        out[name] = column
    return out


def packets_in_partition(conn: Connection, partition: str) -> int:
    """Packets held by one packet_block partition (for delete counts)."""
    return int(conn.exec_driver_sql(f"SELECT coalesce(sum(packets), 0) FROM {partition}").scalar_one())
