"""kernel_trace in the result DB: rows parsed from a literal guest artifact survive both backends (NULL where a
row has no duration or value), a re-ingest and a delete remove them, and the cost table reads them back."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from dbdata import make_run_ingest, table_counts
from sqlalchemy import select

from analysis.kernel_cost import cost_table, load_costs
from orchestrator.ingest.ktrace import parse_kernel_trace
from orchestrator.storage import tables
from orchestrator.storage.writer import delete_run, write_run

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ktrace"


def guest_rows() -> np.ndarray:
    return parse_kernel_trace((FIX / "guest-6.1-tcp_write_xmit.txt").read_bytes(), ["timer:hrtimer_expire_entry"])


def printk_rows() -> np.ndarray:
    return parse_kernel_trace((FIX / "guest-6.1-printk-top-level.txt").read_bytes(), ["timer:hrtimer_expire_entry"])


def test_kernel_trace_round_trip_reingest_delete_and_costs(engine) -> None:
    rows, pk = guest_rows(), printk_rows()
    ingest = dataclasses.replace(make_run_ingest("kt-0001-r0", n_packets=100),
                                 kernel_trace=[("server", rows), ("client", pk)])
    counts = write_run(engine, ingest)
    assert counts.kernel_trace == len(rows) + len(pk)
    t = tables.kernel_trace
    with engine.connect() as conn:
        back = conn.execute(select(t.c.host, t.c.source, t.c.event, t.c.duration_ns, t.c.value)
                            .where(t.c.run_id == "kt-0001-r0")).all()
    calls = sorted(r.duration_ns for r in back if r.source == "kprobe")
    assert calls == sorted(rows[rows["source"] == "kprobe"]["duration_ns"].tolist())
    assert all(r.duration_ns is None and r.value is None for r in back if r.source == "tracepoint")
    assert sorted(r.value for r in back if r.source == "printk") == [655.0, 812.0, 1930.0]
    costs = load_costs(engine, ["kt-0001-r0"])
    assert set(costs) == {("kt-0001", "server", "kprobe", "tcp_write_xmit"),
                          ("kt-0001", "client", "printk", "pc_chirp_compute")}
    table = cost_table(costs)
    row = dict(zip(table.columns, table.rows[1], strict=True))
    assert row["event"] == "tcp_write_xmit" and row["n"] == 145
    write_run(engine, dataclasses.replace(ingest, kernel_trace=[("client", pk)]))   # re-ingest replaces
    assert table_counts(engine, "kt-0001-r0")["kernel_trace"] == len(pk)
    delete_run(engine, "kt-0001-r0")
    assert table_counts(engine, "kt-0001-r0")["kernel_trace"] == 0
