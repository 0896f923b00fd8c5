"""packet blocks on PostgreSQL: `packet_block` (up to 128 packets of one conn a row, packed) and the view
`packet` that shows them one row per packet (orchestrator/storage/packet_store.py, docs/ingest.md); an index on
run.started_at for the run list (both backends).

Existing packet partitions are packed into blocks run by run (in SQL: int8send & co. give the big-endian
bytes of each field) and the partitioned `packet` table is dropped. SQLite keeps its `packet` table: nothing
changes there. Downgrade unpacks the blocks into a partitioned `packet` table again.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from orchestrator.storage.packet_store import BLOCK_PACKETS, PARTITION_DDL, PARTITION_WITH, VIEW_SQL

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "tcplab_part"
# packet_store.RECORD at this revision: field, its send function (big-endian bytes)
_RECORD = (("ts_ns", "int8send"), ("seq", "int8send"), ("ack", "int8send"), ("payload_len", "int4send"),
           ("ip_len", "int4send"), ("tcp_flags", "int2send"), ("ecn", "int2send"), ("ip_id", "int4send"),
           ("tsval", "int8send"), ("tsecr", "int8send"))
_VALUES = ", ".join(name for name, _ in _RECORD)


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _run_keys(parent: str) -> list[int]:
    """run_keys of the partitions attached to `parent`."""
    sql = ("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
           "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :parent")
    names = op.get_bind().execute(sa.text(sql), {"parent": parent}).scalars()
    return sorted(int(n.rsplit("_", 1)[1]) for n in names)


def upgrade() -> None:
    op.create_index("ix_run_started_at", "run", ["started_at"])
    if not _pg():
        return
    op.create_table(
        "packet_block",
        sa.Column("run_key", sa.Integer, nullable=False),
        sa.Column("conn_id", sa.Integer, nullable=False),
        sa.Column("block_no", sa.Integer, nullable=False),
        sa.Column("packets", sa.SmallInteger, nullable=False),
        sa.Column("ts_first_ns", sa.BigInteger, nullable=False),
        sa.Column("ts_last_ns", sa.BigInteger, nullable=False),
        sa.Column("rec", sa.LargeBinary, nullable=False),
        postgresql_partition_by="LIST (run_key)",
    )
    op.create_index("ix_packet_block_run_ts", "packet_block", ["run_key", "ts_first_ns"], postgresql_using="brin")
    packed = " || ".join(f"{send}({name})" for name, send in _RECORD)
    for key in _run_keys("packet"):
        name = f"{SCHEMA}.packet_block_{key}"
        op.execute(f"CREATE TABLE {name} (LIKE packet_block INCLUDING DEFAULTS) WITH ({PARTITION_WITH})")
        for ddl in PARTITION_DDL:
            op.execute(ddl.format(name=name))
        op.execute(
            f"INSERT INTO {name} (run_key, conn_id, block_no, packets, ts_first_ns, ts_last_ns, rec) "
            "SELECT run_key, conn_id, (row_number() OVER (ORDER BY conn_id, blk) - 1)::integer, count(*), "
            f"min(ts_ns), max(ts_ns), string_agg({packed}, ''::bytea ORDER BY i) "
            f"FROM (SELECT run_key, conn_id, {_VALUES}, i, i / {BLOCK_PACKETS} AS blk FROM "
            f"(SELECT *, row_number() OVER (PARTITION BY conn_id ORDER BY ts_ns, ctid) - 1 AS i "
            f"FROM {SCHEMA}.packet_{key}) numbered) p GROUP BY run_key, conn_id, blk")
        op.execute(f"ALTER TABLE packet_block ATTACH PARTITION {name} FOR VALUES IN ({key})")
    op.execute("DROP TABLE packet CASCADE")   # its partitions with it
    op.execute(VIEW_SQL)


def downgrade() -> None:
    op.drop_index("ix_run_started_at", table_name="run")
    if not _pg():
        return
    op.execute("ALTER VIEW packet RENAME TO packet_unpacked")
    big, i4, i2 = sa.BigInteger, sa.Integer, sa.SmallInteger
    op.create_table(
        "packet",
        sa.Column("run_key", i4, nullable=False), sa.Column("conn_id", i4, nullable=False),
        sa.Column("ts_ns", big, nullable=False), sa.Column("seq", big, nullable=False),
        sa.Column("ack", big, nullable=False), sa.Column("payload_len", i4, nullable=False),
        sa.Column("ip_len", i4, nullable=False), sa.Column("tcp_flags", i2, nullable=False),
        sa.Column("ecn", i2, nullable=False), sa.Column("ip_id", i4, nullable=False),
        sa.Column("tsval", big, nullable=False), sa.Column("tsecr", big, nullable=False),
        postgresql_partition_by="LIST (run_key)",
    )
    op.create_index("ix_packet_run_ts", "packet", ["run_key", "ts_ns"], postgresql_using="brin")
    for key in _run_keys("packet_block"):
        op.execute(f"CREATE TABLE {SCHEMA}.packet_{key} PARTITION OF packet FOR VALUES IN ({key})")
    op.execute(f"INSERT INTO packet (run_key, conn_id, {_VALUES}) "
               f"SELECT run_key, conn_id, {_VALUES} FROM packet_unpacked")
    op.execute("DROP VIEW packet_unpacked")
    op.execute("DROP TABLE packet_block CASCADE")
