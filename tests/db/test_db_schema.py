"""orchestrator.storage.db and the Alembic migrations: the migrated schema is exactly tables.py."""
from __future__ import annotations

import json
import multiprocessing
import sqlite3

import numpy as np
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from dbdata import make_run_ingest, plan_row
from sqlalchemy import BigInteger, Column, Float, Integer, MetaData, SmallInteger, String, inspect, text

from orchestrator.storage import records, tables
from orchestrator.storage.db import (
    alembic_config,
    current_revision,
    default_db_url,
    head_revision,
    normalize_url,
    open_db,
)
from orchestrator.storage.run_ingest import BULK_LAYOUTS, BulkLayout
from orchestrator.storage.views import VIEWS
from orchestrator.storage.writer import write_run
from schemas.flag import Flag


def _compare_opts(engine, **opts) -> dict:
    """compare_metadata's options as the migrations' env.py sets them: only this backend's tables."""
    dialect = engine.dialect.name
    return {**opts, "include_object": lambda obj, name, type_, *_: type_ != "table" or tables.in_schema(name, dialect)}


def test_migrated_schema_equals_metadata(engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=_compare_opts(engine, compare_type=True,
                                                                  compare_server_default=True))
        diff = compare_metadata(ctx, tables.metadata)
    assert diff == []
    assert current_revision(engine) == head_revision() == "0018"
    names = set(inspect(engine).get_table_names())
    here = {t for t in tables.metadata.tables if tables.in_schema(t, engine.dialect.name)}
    assert names == here | {"alembic_version"}
    if engine.dialect.name == "postgresql":
        assert sorted(inspect(engine).get_view_names()) == sorted(["packet", *VIEWS])   # packet: over the blocks


def test_bulk_indexes_exist(engine) -> None:
    insp = inspect(engine)
    packets = "packet_block" if engine.dialect.name == "postgresql" else "packet"
    got = {t: {ix["name"]: ix["column_names"] for ix in insp.get_indexes(t)}
           for t in (packets, "qdelay", "tcp_probe", "qdisc_sample", "ss_sample", "iperf_interval")}
    packet_index = {"packet_block": {"ix_packet_block_run_ts": ["run_key", "ts_first_ns"]},
                    "packet": {"ix_packet_run_ts": ["run_key", "ts_ns"]}}[packets]
    assert got == {
        packets: packet_index,
        "qdelay": {"ix_qdelay_run_ts": ["run_key", "ts_in_ns"]},
        "tcp_probe": {"ix_tcp_probe_run_ts": ["run_key", "ts_ns"]},
        "qdisc_sample": {"ix_qdisc_sample_run_ts": ["run_key", "ts_ns"]},
        "ss_sample": {"ix_ss_sample_run_ts": ["run_key", "ts_ns"]},
        "iperf_interval": {"ix_iperf_interval_run_id": ["run_id"]},
    }


def test_open_db_is_idempotent_and_keeps_data(db_url) -> None:
    eng = open_db(db_url)
    with eng.begin() as conn:
        conn.execute(tables.plan.insert(), [plan_row()])
    eng.dispose()
    eng = open_db(db_url)
    try:
        with eng.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM plan")) == 1
            assert conn.scalar(text("SELECT count(*) FROM alembic_version")) == 1
    finally:
        eng.dispose()


def test_downgrade_removes_every_table(engine) -> None:
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    assert inspect(engine).get_view_names() == []


def test_sqlite_file_parent_dirs_pragmas(tmp_path) -> None:
    path = tmp_path / "a" / "b" / "tcplab.db"
    eng = open_db(f"sqlite:///{path}")
    try:
        assert path.is_file()
        with eng.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        eng.dispose()
    # The journal mode is persistent in the file: other tools (sqlite3 CLI, analysis) see WAL too.
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_foreign_keys_enforced(tmp_path) -> None:
    eng = open_db(f"sqlite:///{tmp_path}/x.db")
    try:
        with pytest.raises(Exception, match="FOREIGN KEY"):
            with eng.begin() as conn:
                conn.execute(tables.host_evidence.insert(), [{"run_id": "nope", "host": "h",
                                                              "phase": "hello", "data": {}}])
    finally:
        eng.dispose()


def test_default_db_url(monkeypatch) -> None:
    monkeypatch.delenv("TCPLAB_DB", raising=False)
    assert default_db_url() == "sqlite:///results/tcplab.db"
    monkeypatch.setenv("TCPLAB_DB", "postgresql://u@h/db")
    assert default_db_url() == "postgresql://u@h/db"


def test_open_db_default_is_results_dir_under_cwd(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TCPLAB_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    eng = open_db()
    eng.dispose()
    assert (tmp_path / "results" / "tcplab.db").is_file()


@pytest.mark.parametrize("url, driver", [
    ("postgresql://u:p@h:5433/db", "postgresql+psycopg"),
    ("postgres://u@h/db", "postgresql+psycopg"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
    ("sqlite:///x.db", "sqlite"),
])
def test_normalize_url_maps_postgres_to_psycopg3(url, driver) -> None:
    parsed = normalize_url(url)
    assert parsed.drivername == driver
    assert parsed.database in ("db", "x.db")


@pytest.mark.postgres
def test_open_db_accepts_plain_postgresql_url(pg_url) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    eng = open_db(plain)
    try:
        assert eng.dialect.driver == "psycopg"
        assert current_revision(eng) == head_revision()
    finally:
        eng.dispose()


def test_bulk_layouts_cover_every_column() -> None:
    for layout in BULK_LAYOUTS:
        assert sorted(layout.columns) == sorted(layout.table.columns.keys()), layout.table.name
    packet_cols = {"run_key", "conn_id", *records.PACKET_VALUE_FIELDS}
    assert packet_cols == set(tables.packet.columns.keys())
    assert set(records.CONN_FIELDS) - {"point"} < set(tables.conn.columns.keys())


def test_schema_comparison_would_see_a_difference(engine) -> None:
    """Guards the equality test above: a drifted model (extra column, dropped index) is reported."""
    drifted = MetaData()
    for table in tables.metadata.sorted_tables:
        copy = table.to_metadata(drifted)
        if table.name == "run":
            copy.append_column(Column("kernel_variant", String(64), nullable=True))
        if table.name == "tcp_probe":
            copy.indexes.clear()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts=_compare_opts(engine, compare_type=True)),
                                drifted)
    kinds = sorted(d[0] for d in diff)
    assert kinds == ["add_column", "remove_index"]


def _open_in_process(url: str) -> str:
    try:
        eng = open_db(url)
    except Exception as exc:  # reported to the parent, which asserts on it
        return f"{type(exc).__name__}: {exc}"
    try:
        return str(current_revision(eng))
    finally:
        eng.dispose()


def test_concurrent_open_db_on_a_fresh_database(db_url) -> None:
    """Several processes starting on one empty DB migrate it once, without errors.

    Processes, not threads: that is the real case, and Alembic's context is process-global.
    Without the migration lock this fails now and then: DuplicateTable or UniqueViolation on
    alembic_version (PostgreSQL, no advisory lock), "database is locked" (SQLite, deferred BEGIN).
    """
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        assert pool.map(_open_in_process, [db_url] * 3) == [head_revision()] * 3


def test_record_dtypes_fit_their_columns() -> None:
    """records.py and tables.py agree: COPY sends each field at its column's width, no truncation."""
    ints = {2: SmallInteger, 4: Integer, 8: BigInteger}
    packet = BulkLayout("packets", tables.packet, (), np.dtype([(n, records.PACKET.fields[n][0])
                                                                for n in records.PACKET_VALUE_FIELDS]))
    for layout in (*BULK_LAYOUTS, packet):
        for name in layout.dtype.names:
            field, col = layout.dtype[name], layout.table.c[name].type
            if field.kind == "i":
                assert type(col) is ints[field.itemsize], (layout.table.name, name)
            elif field.kind == "f":
                assert isinstance(col, Float) and field.itemsize == 8, (layout.table.name, name)
            else:
                assert field.kind == "U" and isinstance(col, String), (layout.table.name, name)
                assert field.itemsize // 4 == col.length, (layout.table.name, name)


LINES = ["accepted G-NETEM host aqm: netem on the interface toward client holds 5 packets",
         "G-CPULOAD host client+aqm+server: cpu1 was > 90% busy for 82% of the measurement window",
         "client/capture-to-aqm: capture incomplete (G-CAPTURE): 0 dropped by kernel, 87 received but not written",
         "aqm: reset left sysctl net.ipv4.tcp_ecn: '1' != '0'",
         "client: to-aqm: coalescing rx-usecs off by absence (driver veth: no such parameter)"]


def test_flag_lines_become_objects_and_back(engine) -> None:
    """Migration 0005 on runs stored before flags were values: every line format becomes one object."""
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0004")
        conn.execute(tables.plan.insert(), plan_row())
        conn.execute(text("INSERT INTO run (run_key, run_id, plan_sha256, plan_name, experiment, repetition, seed, "
                          "status, params, derived, spec, tags, duration_s, flags) VALUES (1, 'r', :sha, 'p', 'e', "
                          "0, 0, 'complete', '{}', '{}', '{}', '[]', 1.0, :flags)"),
                     {"sha": plan_row()["plan_sha256"], "flags": json.dumps(LINES)})
        command.upgrade(alembic_config(conn), "0005")
        flags = conn.execute(text("SELECT flags FROM run")).scalar_one()
    flags = json.loads(flags) if isinstance(flags, str) else flags
    assert [(f["guard"], f.get("host"), f.get("accepted", False)) for f in flags] == [
        ("G-NETEM", "aqm", True), ("G-CPULOAD", "client+aqm+server", False), ("G-CAPTURE", "client", False),
        ("G-RESET", "aqm", False), ("G-NIC", "client", False)]
    assert [str(Flag.from_stored(f)) for f in flags][:2] == LINES[:2]
    assert [Flag.from_stored(f) for f in flags] == [Flag.from_stored(line) for line in LINES]   # one rule
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0004")
        back = conn.execute(text("SELECT flags FROM run")).scalar_one()
        command.upgrade(alembic_config(conn), "head")
    assert (json.loads(back) if isinstance(back, str) else back)[:2] == LINES[:2]


def test_runs_stored_before_profiles_keep_their_rows_and_read_no_profile(engine) -> None:
    """Migration 0006 adds run.profile: a run stored at 0005 survives the upgrade with profile NULL, and a
    downgrade drops the column without losing the run."""
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0005")
        conn.execute(tables.plan.insert(), plan_row())
        conn.execute(text("INSERT INTO run (run_key, run_id, plan_sha256, plan_name, experiment, repetition, seed, "
                          "status, params, derived, spec, tags, duration_s, flags) VALUES (1, 'r', :sha, 'p', 'e', "
                          "0, 0, 'complete', '{}', '{}', '{}', '[]', 1.0, '[]')"), {"sha": plan_row()["plan_sha256"]})
        command.upgrade(alembic_config(conn), "head")
        assert conn.execute(text("SELECT run_id, profile FROM run")).one() == ("r", None)
        conn.execute(text("UPDATE run SET profile = 'vm-lab'"))
        command.downgrade(alembic_config(conn), "0005")
        assert conn.execute(text("SELECT run_id FROM run")).scalar_one() == "r"
        command.upgrade(alembic_config(conn), "head")
        assert conn.execute(text("SELECT profile FROM run")).scalar_one() is None


def test_migration_0018_takes_the_bulk_flow_columns_back_and_adds_them_again(engine) -> None:
    write_run(engine, make_run_ingest("mg-0018", n_packets=50, seed=7))
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0017")
    flow_columns = {c["name"] for c in inspect(engine).get_columns("flow")}
    assert not flow_columns & {"sink_bytes", "sink_goodput_bps", "fct_ns"}
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT sink_bytes, sink_goodput_bps, fct_ns FROM flow "
                                 "WHERE run_id = 'mg-0018'")).all()
    assert rows and all(r == (None, None, None) for r in rows)     # existing flows: NULL
