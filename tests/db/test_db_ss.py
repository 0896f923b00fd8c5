"""ss_sample in the result DB: real `ss -tinH` rows survive both backends exactly, NULLs included,
and a re-ingest replaces them."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from dbdata import make_run_ingest, ss_samples, table_counts
from sqlalchemy import select

from orchestrator.storage import records, tables
from orchestrator.storage.writer import write_run


def _expected(arr: np.ndarray) -> list[tuple]:
    """Rows as the DB should return them: NULL (None) where the array holds -1 / NaN."""
    nulls = records.null_masks(arr, records.SS_NULLABLE)
    cols = []
    for name in records.SS_SAMPLE.names:
        values = arr[name].tolist()
        if name in nulls:
            values = [None if m else v for v, m in zip(values, nulls[name].tolist(), strict=True)]
        cols.append(values)
    return sorted(zip(*cols, strict=True), key=repr)


def _back(engine, run_id: str) -> list[tuple]:
    t = tables.ss_sample
    key = select(tables.run.c.run_key).where(tables.run.c.run_id == run_id).scalar_subquery()
    with engine.connect() as conn:
        rows = conn.execute(select(*(t.c[n] for n in records.SS_SAMPLE.names)).where(t.c.run_key == key)).all()
    return sorted((tuple(r) for r in rows), key=repr)


def test_ss_rows_round_trip_with_nulls(engine) -> None:
    ingest = make_run_ingest("ss-0001", n_packets=100)
    counts = write_run(engine, ingest)
    arr = ss_samples()
    assert counts.ss_sample == arr.size == 20
    back = _back(engine, "ss-0001")
    assert back == _expected(arr)
    by_cc = {}
    for row in back:
        by_cc.setdefault(row[records.SS_SAMPLE.names.index("cc")], []).append(dict(zip(records.SS_SAMPLE.names, row,
                                                                                   strict=True)))
    dctcp = sorted(by_cc["dctcp"], key=lambda r: r["sport"])
    assert [r["dctcp_alpha"] for r in dctcp] == [None, 0.5]      # fallback mode, then 512 / 1024
    assert [r["dctcp_ab_tot"] for r in dctcp] == [None, 130320]
    assert dctcp[0]["ssthresh"] is None and dctcp[1]["ssthresh"] == 21
    bbr = by_cc["bbr"]
    assert all(r["bbr_bw_bit"] > 0 and r["dctcp_alpha"] is None for r in bbr)
    assert {r["bbr_cwnd_gain"] for r in bbr} >= {2.0}
    assert all(not (isinstance(v, float) and math.isnan(v)) for r in back for v in r)


def test_ss_reingest_replaces(engine) -> None:
    ingest = make_run_ingest("ss-0002", n_packets=100)
    write_run(engine, ingest)
    fewer = dataclasses.replace(ingest, ss_samples=[("client", ss_samples()[:5])])
    write_run(engine, fewer)
    write_run(engine, fewer)
    assert table_counts(engine, "ss-0002")["ss_sample"] == 5
    assert _back(engine, "ss-0002") == _expected(ss_samples()[:5])
