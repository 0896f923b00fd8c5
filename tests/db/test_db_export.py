"""`tcplab export` (analysis/parquet_export.py): what the database holds, read back identically with pyarrow and
DuckDB, each row with its run's metadata."""
from __future__ import annotations

import dataclasses

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dbdata import make_run_ingest, packets_back
from sqlalchemy import text

from analysis.parquet_export import param_columns, read_metadata
from orchestrator.cli import main
from orchestrator.storage.writer import write_run


def _store(engine) -> list:
    runs = []
    for i, params in enumerate(({"cc": "cubic", "rate_bit": 20_000_000}, {"cc": "bbr", "rate_bit": 50_000_000})):
        ingest = make_run_ingest(f"ex-{i:04d}", n_packets=3_000, seed=i)
        ingest = dataclasses.replace(ingest, run={**ingest.run, "params": params, "run_by": "alice",
                                                  "plan_commit": "abc123"})
        write_run(engine, ingest)
        runs.append(ingest)
    return runs


def _export(db_url, tmp_path, what: str) -> object:
    out = tmp_path / f"{what}.parquet"
    with pytest.raises(SystemExit) as done:
        main(["export", "plan:quickstart", "--what", what, "--out", str(out), "--db", db_url])
    assert done.value.code == 0
    return out


def test_runs_and_flows_carry_metadata_and_params(engine, db_url, tmp_path) -> None:
    _store(engine)
    runs = pq.read_table(_export(db_url, tmp_path, "runs")).to_pylist()
    assert [(r["run_id"], r["param_cc"], r["param_rate_bit"], r["run_by"], r["plan_commit"]) for r in runs] == [
        ("ex-0000", "cubic", 20_000_000, "alice", "abc123"), ("ex-0001", "bbr", 50_000_000, "alice", "abc123")]
    assert runs[0]["kernel_variant"] == "vanilla-6.1" and runs[0]["started_at"].tzinfo is not None
    flows_path = _export(db_url, tmp_path, "flows")
    flows = pq.read_table(flows_path).to_pylist()
    with engine.connect() as conn:
        want = conn.execute(text("SELECT run_id, flow_id, goodput_bps FROM v_flow ORDER BY run_id, flow_id")).all()
    assert [(f["run_id"], f["flow_id"], f["goodput_bps"]) for f in flows] == [tuple(w) for w in want]
    assert {f["param_cc"] for f in flows if f["run_id"] == "ex-0001"} == {"bbr"}
    meta = read_metadata(flows_path)
    assert meta["selectors"] == ["plan:quickstart"] and meta["run_ids"] == ["ex-0000", "ex-0001"]
    assert meta["what"] == "flows" and meta["tcplab_version"]


def test_packets_and_qdelay_read_back_identically(engine, db_url, tmp_path) -> None:
    stored = _store(engine)
    packets = _export(db_url, tmp_path, "packets")
    table = pq.read_table(packets)
    cols = ("point", "proto", "src_addr", "dst_addr", "src_port", "dst_port", "ts_ns", "seq", "ack", "payload_len",
            "ip_len", "tcp_flags", "ecn", "ip_id", "tsval", "tsecr")
    for ingest in stored:
        run_id = ingest.run["run_id"]
        mine = table.filter(pc.equal(table.column("run_id"), run_id))
        got = sorted(zip(*(mine.column(c).to_pylist() for c in cols), strict=True))
        want = sorted((r[0], r[1], *r[3:]) for r in packets_back(engine, run_id))   # without ipv
        assert got == want
        assert set(mine.column("param_cc").to_pylist()) == {ingest.run["params"]["cc"]}
    qdelay = _export(db_url, tmp_path, "qdelay")
    with engine.connect() as conn:
        want = conn.execute(text("SELECT r.run_id, count(*), sum(q.sojourn_ns), sum(q.dropped) FROM qdelay q "
                                 "JOIN run r ON r.run_key = q.run_key GROUP BY r.run_id ORDER BY r.run_id")).all()
    got = duckdb.sql(f"SELECT run_id, count(*), sum(sojourn_ns), sum(dropped) FROM '{qdelay}' GROUP BY run_id "
                     "ORDER BY run_id").fetchall()
    assert got == [tuple(w) for w in want]
    (n_packets,) = duckdb.sql(f"SELECT count(*), count(DISTINCT run_id) FROM '{packets}'").fetchall()
    assert n_packets == (6_000, 2)


def test_param_columns_keep_one_type_per_column() -> None:
    cols = param_columns([{"rate": 1, "arm": "a", "mix": 1, "nested": {"x": 1}},
                          {"rate": 2.5, "mix": "two", "flag": True}])
    assert cols == {"param_arm": ["a", None], "param_flag": [None, True], "param_mix": ["1", '"two"'],
                    "param_nested": ['{"x": 1}', None], "param_rate": [1, 2.5]}


def test_a_selector_naming_nothing_exits_2(engine, db_url, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["export", "plan:nope", "--out", str(tmp_path / "x.parquet"), "--db", db_url])
    assert done.value.code == 2 and "plan:nope" in capsys.readouterr().err
