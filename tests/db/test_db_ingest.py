"""orchestrator.storage.writer: one-transaction writes, replace on re-ingest, rollback, bulk loads."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from dbdata import (
    PLAN_SHA,
    POINTS,
    make_run_ingest,
    packets_back,
    packets_expected,
    plan_row,
    run_row,
    snapshot,
    table_counts,
)
from sqlalchemy import select, text

from orchestrator.storage import bulk, pgcopy, records, tables
from orchestrator.storage.db import open_db
from orchestrator.storage.run_ingest import IngestCounts, IngestError, RunIngest, validate
from orchestrator.storage.writer import completed_builds, completed_run_ids, delete_run, write_run

# conn: 2 points x (IPv4, IPv6 flow) x (TCP, UDP)
EXPECTED_100K = {"plan": 1, "run": 1, "flow": 2, "artifact": 2, "host_evidence": 6, "run_host": 3, "capture_point": 2,
                 "conn": 8, "packet": 100_000, "qdelay": 10_000, "qdelay_pair": 1, "tcp_probe": 3_000,
                 "qdisc_sample": 2_000, "ss_sample": 20, "iperf_interval": 600, "kernel_trace": 0,
                 "run_event": 0, "app_write": 60}
_packets_back = packets_back


def test_round_trip_100k_packets(engine, db_url, make_ingest) -> None:
    ingest = make_ingest("rt-0001", n_packets=100_000)
    t = time.perf_counter()
    counts = write_run(engine, ingest)
    elapsed = time.perf_counter() - t
    print(f"\n[{engine.dialect.name}] write_run: {counts.total:,} rows in {elapsed:.2f} s "
          f"({counts.total / elapsed:,.0f} rows/s; packet rows {counts.packet:,})")

    assert counts.as_dict() == EXPECTED_100K
    assert table_counts(engine) == EXPECTED_100K
    with engine.connect() as conn:   # app_write: values and NULLs survive COPY / executemany
        rows = conn.execute(tables.app_write.select().order_by(tables.app_write.c.write_index)).mappings().all()
    want = dict(ingest.app_writes)[1]
    assert [r["latency_ns"] for r in rows] == want["latency_ns"].tolist()
    assert [r["stream_offset"] for r in rows] == want["stream_offset"].tolist()
    assert all(r["read_ns"] is None and r["read_latency_ns"] is None for r in rows)
    # Every packet field survives exactly (64-bit values, -1 sentinels, IPv6 text, UDP rows).
    assert _packets_back(engine, "rt-0001") == packets_expected(ingest)
    with engine.connect() as conn:
        run = conn.execute(select(tables.run)).mappings().one()
        probe = conn.execute(text("SELECT sock_cookie, ssthresh FROM tcp_probe LIMIT 1")).one()
        q = conn.execute(text("SELECT sum(drops), max(backlog_bytes) FROM qdisc_sample "
                              "WHERE interface = 'veth-cli'")).one()
        iperf = conn.execute(text("SELECT flow_id, count(*), sum(bits_per_second) FROM iperf_interval "
                                  "GROUP BY flow_id ORDER BY flow_id")).all()
        ev_t = tables.host_evidence
        ev = conn.scalar(select(ev_t.c.data).where(ev_t.c.host == "aqm", ev_t.c.phase == "apply"))
    assert run["params"] == {"aqm": "fq_codel", "rtt_ms": 40} and run["tags"] == ["smoke"]
    assert (run["seed"], run["t0_ns"], run["status"]) == (42, ingest.run["t0_ns"], "complete")
    assert tuple(probe) == (2**62 + 7, 2_147_483_647)
    qarr = ingest.qdisc_samples[1][2]
    assert (int(q[0]), int(q[1])) == (int(qarr["drops"].sum()), int(qarr["backlog_bytes"].max()))
    assert [(f, n) for f, n, _ in iperf] == [(0, 300), (1, 300)]
    assert iperf[0][2] == pytest.approx(float(ingest.iperf_intervals[0][1]["bits_per_second"].sum()))
    assert ev == {"kernel": "6.1.0", "sysctls": {"net.core.x": "1"}}


@pytest.mark.postgres
def test_sqlite_and_postgresql_hold_identical_data(tmp_path, pg_url) -> None:
    ingest = make_run_ingest("same-0001", n_packets=20_000, seed=7)
    results = {}
    for url in (f"sqlite:///{tmp_path}/r.db", pg_url):
        eng = open_db(url)
        try:
            results[eng.dialect.name] = (write_run(eng, ingest), table_counts(eng),
                                         _packets_back(eng, "same-0001"))
        finally:
            eng.dispose()
    assert results["sqlite"] == results["postgresql"]


def test_reingest_replaces_without_duplicates(engine) -> None:
    write_run(engine, make_run_ingest("re-0001", n_packets=5_000, seed=1))
    other = make_run_ingest("re-0002", n_packets=3_000, seed=2)
    write_run(engine, other)
    before_other = table_counts(engine, "re-0002")

    smaller = make_run_ingest("re-0001", n_packets=2_000, seed=3, status="failed")
    smaller = dataclasses.replace(smaller, flows=smaller.flows[:1], tcp_probe=[])
    counts = write_run(engine, smaller)
    again = write_run(engine, smaller)

    assert counts == again
    after = table_counts(engine, "re-0001")
    assert after["packet"] == 2_000 and after["flow"] == 1 and after["tcp_probe"] == 0
    assert after["run"] == 1 and after["plan"] == 1
    assert table_counts(engine, "re-0002") == before_other   # the other run is untouched
    assert _packets_back(engine, "re-0001") == packets_expected(smaller)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT status FROM run WHERE run_id = 're-0001'")) == "failed"


def test_plan_upsert_keeps_one_row_and_first_created_at(engine) -> None:
    write_run(engine, make_run_ingest("pl-0001", n_packets=10))
    moved = plan_row(path="experiments/moved/quickstart.yaml")
    moved["created_at"] = moved["created_at"].replace(year=2030)
    write_run(engine, make_run_ingest("pl-0002", n_packets=10, plan=moved))
    with engine.connect() as conn:
        rows = conn.execute(select(tables.plan.c.path, tables.plan.c.created_at)).all()
    assert len(rows) == 1
    assert rows[0].path == "experiments/moved/quickstart.yaml"
    assert rows[0].created_at.year == 2024


def _fail_on_flow_999(engine) -> None:
    """A real database-side failure on the very last rows write_run sends (iperf_interval)."""
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER fail_late BEFORE INSERT ON iperf_interval WHEN NEW.flow_id = 999 "
                "BEGIN SELECT RAISE(ABORT, 'injected failure'); END")
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION fail_late() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.flow_id = 999 THEN RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$")
            conn.exec_driver_sql("CREATE TRIGGER fail_late BEFORE INSERT ON iperf_interval "
                                 "FOR EACH ROW EXECUTE FUNCTION fail_late()")


def test_failure_at_the_end_rolls_back_everything(engine) -> None:
    write_run(engine, make_run_ingest("rb-0001", n_packets=20_000, seed=1))
    _fail_on_flow_999(engine)
    before = snapshot(engine)

    bad = make_run_ingest("rb-0001", n_packets=30_000, seed=2,
                          plan=plan_row(path="experiments/other.yaml"))
    last = np.zeros(3, records.IPERF_INTERVAL)
    bad = dataclasses.replace(bad, iperf_intervals=[*bad.iperf_intervals, (999, last)])
    with pytest.raises(IngestError, match="injected failure") as err:
        write_run(engine, bad)
    assert err.value.where == "iperf_intervals"

    # The earlier ingest (deleted early in the failed transaction) and the plan row are back as they were.
    assert snapshot(engine) == before
    # The engine's connections are healthy after the aborted COPY / executemany.
    ok = dataclasses.replace(bad, iperf_intervals=bad.iperf_intervals[:-1])
    assert write_run(engine, ok).packet == 30_000


def test_wrong_dtype_at_the_end_changes_nothing(engine) -> None:
    write_run(engine, make_run_ingest("dt-0001", n_packets=5_000, seed=1))
    before = snapshot(engine)
    bad = make_run_ingest("dt-0001", n_packets=6_000, seed=2)
    wrong = np.zeros(4, [("stream_port", "i4"), ("start_s", "f4")])
    bad = dataclasses.replace(bad, iperf_intervals=[*bad.iperf_intervals, (2, wrong)])
    with pytest.raises(IngestError, match="dtype") as err:
        write_run(engine, bad)
    assert err.value.where == "iperf_intervals[2]"
    assert snapshot(engine) == before


def test_integrity_error_names_the_part_and_rolls_back(engine) -> None:
    write_run(engine, make_run_ingest("ie-0001", n_packets=1_000, seed=1))
    before = snapshot(engine)
    bad = make_run_ingest("ie-0001", n_packets=2_000, seed=2)
    bad = dataclasses.replace(bad, evidence=[*bad.evidence, dict(bad.evidence[0])])  # duplicate key
    with pytest.raises(IngestError) as err:
        write_run(engine, bad)
    assert err.value.where == "evidence"
    assert snapshot(engine) == before


def test_delete_run_removes_every_row_of_that_run_only(engine) -> None:
    written = write_run(engine, make_run_ingest("del-0001", n_packets=4_000, seed=1))
    other = write_run(engine, make_run_ingest("del-0002", n_packets=1_000, seed=2))
    removed = delete_run(engine, "del-0001")
    assert removed == dataclasses.replace(written, plan=0)
    # What is left in every table is exactly the other run (plans are shared by runs and stay).
    assert table_counts(engine) == other.as_dict()
    assert table_counts(engine, "del-0002")["packet"] == 1_000
    assert delete_run(engine, "del-0001") == IngestCounts()
    if engine.dialect.name == "postgresql":   # its partitions are gone too
        with engine.connect() as conn:
            names = conn.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = 'tcplab_part'")).all()
        key = table_counts(engine)["run"]
        assert len(names) == len(tables.PARTITIONED_TABLES) == 5 and key == 1


def test_completed_run_ids(engine) -> None:
    write_run(engine, make_run_ingest("c-0001", n_packets=10))
    write_run(engine, make_run_ingest("c-0002", n_packets=10, status="failed"))
    other_plan = plan_row(sha="b" * 64)
    other = RunIngest(run=run_row("c-0003", plan_sha256="b" * 64), plan=other_plan)
    write_run(engine, other)
    write_run(engine, RunIngest(run=run_row("c-0004", plan_sha256=None)))
    # a refused run (preflight said no, no host touched) is stored but not done: the next `tcplab run` retries it
    write_run(engine, make_run_ingest("c-0005", n_packets=0, status="refused"))
    assert completed_run_ids(engine, PLAN_SHA) == {"c-0001"}
    assert completed_run_ids(engine, "b" * 64) == {"c-0003"}
    assert completed_run_ids(engine, "c" * 64) == set()


def test_completed_runs_name_the_kernel_builds_they_ran_on(engine) -> None:
    """`tcplab run` skips a complete run only on the same builds: the stored spec says which build each host
    ran (hosts.<role>.kernel.build_key; absent for a distribution kernel or none asked)."""
    built = {"name": "fix", "vanilla": False, "release": "6.1.192-fix-0a", "sha256": "s", "build_key": "0a" * 32}
    stock = {"name": "stock", "vanilla": True, "release": "6.1.0-56-amd64", "sha256": "t"}
    spec = {"run_id": "k-1", "hosts": {"sender": {"kernel": built}, "aqm": {"kernel": stock}, "receiver": {}}}
    write_run(engine, RunIngest(run={**run_row("k-1"), "spec": spec}, plan=plan_row()))
    assert completed_builds(engine, PLAN_SHA) == {"k-1": {"sender": "0a" * 32, "aqm": None, "receiver": None}}


# --- pure parts --------------------------------------------------------------------------------------

def test_sqlite_rows_batches_constants_and_nulls() -> None:
    data = {"run_key": 3, "host": "aqm", "x": np.arange(5, dtype=np.int64)}
    batches = list(bulk.sqlite_rows(["run_key", "host", "x"], data, {"x": np.arange(5) == 2}, batch=2))
    assert [len(b) for b in batches] == [2, 2, 1]
    flat = [r for b in batches for r in b]
    assert flat == [(3, "aqm", 0), (3, "aqm", 1), (3, "aqm", None), (3, "aqm", 3), (3, "aqm", 4)]
    assert all(type(v) in (str, int) for r in flat for v in r if v is not None)  # native values


def test_pgcopy_rows_are_the_binary_copy_format() -> None:
    """Fixed-width rows, a text column (grouped by value), a NULL pattern and a scalar constant."""
    cols = [("a", "int2"), ("b", "int8"), ("t", "text"), ("k", "int4")]
    data = {"a": np.array([1, -2], np.int16), "b": np.array([2**40, 5]), "t": np.array(["x", "yz"]), "k": 7}
    got = b"".join(pgcopy.encode(cols, data, {"b": np.array([False, True])}))
    row0 = (b"\x00\x04" + b"\x00\x00\x00\x02\x00\x01" + b"\x00\x00\x00\x08" + (2**40).to_bytes(8, "big")
            + b"\x00\x00\x00\x01x" + b"\x00\x00\x00\x04\x00\x00\x00\x07")
    row1 = (b"\x00\x04" + b"\x00\x00\x00\x02\xff\xfe" + b"\xff\xff\xff\xff"
            + b"\x00\x00\x00\x02yz" + b"\x00\x00\x00\x04\x00\x00\x00\x07")
    assert sorted([got[:len(row0)], got[len(row0):]]) == sorted([row0, row1])
    assert b"".join(pgcopy.encode(cols[:2], {"a": data["a"], "b": data["b"]}))[2:8] == row0[2:8]


@pytest.mark.parametrize("change, where", [
    (lambda i: dataclasses.replace(i, run={**i.run, "colour": "red"}), "run"),
    (lambda i: dataclasses.replace(i, run={k: v for k, v in i.run.items() if k != "status"}), "run"),
    (lambda i: dataclasses.replace(i, run={**i.run, "status": "running"}), "run.status"),
    (lambda i: dataclasses.replace(i, plan={**i.plan, "plan_sha256": "d" * 64}), "run.plan_sha256"),
    (lambda i: dataclasses.replace(i, flows=[{**i.flows[0], "run_id": "x"}]), "flows[0]"),
    (lambda i: dataclasses.replace(i, packets=[(POINTS[0],)]), "packets[0]"),
    (lambda i: dataclasses.replace(i, packets=[(POINTS[0], i.packets[0][1].reshape(-1, 1))]), "packets[0]"),
    (lambda i: dataclasses.replace(i, tcp_probe=[("client", i.packets[0][1])]), "tcp_probe[0]"),
])
def test_validate_refuses(change, where) -> None:
    ingest = make_run_ingest("v-0001", n_packets=10)
    validate(ingest)
    with pytest.raises(IngestError) as err:
        validate(change(ingest))
    assert err.value.where == where
