"""Two managers ingesting into one database at once (docs/database.md, "Two managers, one database"): distinct
runs of the same plan, written by two processes with their own engines, all arrive, none lost or mixed up."""
from __future__ import annotations

import dataclasses
import multiprocessing
import threading
import time
import zlib

import pytest
from dbdata import PLAN_SHA, make_run_ingest, packets_back, packets_expected, plan_row, table_counts
from sqlalchemy import text

from orchestrator.storage.db import create_db_engine, open_db
from orchestrator.storage.writer import write_run

RUNS_PER_WRITER = 4
PACKETS = 20_000


def _seed(writer: str, i: int) -> int:
    return zlib.crc32(f"{writer}-{i}".encode())   # not hash(): randomised per process


def _ingest(url: str, writer: str, start_at: float) -> list[tuple[str, float, float]]:
    """One manager: its own engine, RUNS_PER_WRITER runs; returns (run id, start, end) of each write."""
    eng = open_db(url)
    spans = []
    try:
        time.sleep(max(0.0, start_at - time.time()))
        for i in range(RUNS_PER_WRITER):
            ingest = make_run_ingest(f"{writer}-{i:04d}", n_packets=PACKETS, seed=_seed(writer, i))
            began = time.time()
            write_run(eng, ingest)
            spans.append((ingest.run["run_id"], began, time.time()))
    finally:
        eng.dispose()
    return spans


def test_two_writers_at_once_lose_nothing(db_url) -> None:
    open_db(db_url).dispose()   # migrated before the writers start, as a deployed database is
    start_at = time.time() + 2.0
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        spans = pool.starmap(_ingest, [(db_url, "alpha", start_at), (db_url, "beta", start_at)])
    eng = open_db(db_url)
    try:
        run_ids = [s[0] for per in spans for s in per]
        with eng.connect() as conn:
            assert sorted(conn.scalars(text("SELECT run_id FROM run"))) == sorted(run_ids)
            assert conn.scalar(text("SELECT count(*) FROM plan")) == 1
            assert conn.scalar(text("SELECT plan_sha256 FROM plan")) == PLAN_SHA
            keys = list(conn.scalars(text("SELECT run_key FROM run")))
        assert len(set(keys)) == len(run_ids)
        for writer, per in zip(("alpha", "beta"), spans, strict=True):
            for i, (run_id, _, _) in enumerate(per):
                expected = make_run_ingest(run_id, n_packets=PACKETS, seed=_seed(writer, i))
                assert packets_back(eng, run_id) == packets_expected(expected)
                counts = table_counts(eng, run_id)
                assert counts["qdelay"] == PACKETS // 10 and counts["tcp_probe"] == 3_000, run_id
    finally:
        eng.dispose()


class _PausedPackets:
    """A capture that stops after its first chunk until released: a manager caught in the middle of its COPY."""

    def __init__(self, chunks: list, started: threading.Event, release: threading.Event) -> None:
        self.chunks, self.started, self.release = chunks, started, release

    def __iter__(self):
        yield self.chunks[0]
        self.started.set()
        assert self.release.wait(60)
        yield from self.chunks[1:]


@pytest.mark.postgres
def test_a_writer_does_not_wait_for_another_manager_mid_ingest_of_the_same_plan(pg_url) -> None:
    """Manager A is paused inside its transaction (plan stored, packets half copied); manager B's whole ingest of
    another run of the same plan must go through meanwhile. B's lock_timeout turns any wait into an error."""
    eng = open_db(pg_url)
    impatient = create_db_engine(pg_url + "?options=-c%20lock_timeout%3D3000")
    started, release = threading.Event(), threading.Event()
    a = make_run_ingest("a-0001", n_packets=4_000, seed=1, plan=plan_row(path="testbed-a/quickstart.yaml"))
    point, arr = a.packets[0]
    a = dataclasses.replace(a, packets=[(point, _PausedPackets([arr[:1000], arr[1000:]], started, release)),
                                        *a.packets[1:]])
    errors: list[BaseException] = []

    def manager_a() -> None:
        try:
            write_run(eng, a)
        except BaseException as exc:   # reported to the test thread
            errors.append(exc)

    thread = threading.Thread(target=manager_a)
    thread.start()
    try:
        assert started.wait(30)
        b = make_run_ingest("b-0001", n_packets=4_000, seed=2)
        write_run(impatient, b)            # same plan (its path as manager B has it): no wait for A
    finally:
        release.set()
        thread.join(60)
    assert not errors
    with eng.connect() as conn:
        assert sorted(conn.scalars(text("SELECT run_id FROM run"))) == ["a-0001", "b-0001"]
        assert conn.scalar(text("SELECT count(*) FROM packet")) == 8_000
    eng.dispose()
    impatient.dispose()
