"""Saved queries (orchestrator/storage/saved_queries.py) through `tcplab query --name` on SQLite and PostgreSQL."""
from __future__ import annotations

import dataclasses
import json

import pytest
from dbdata import make_run_ingest

from orchestrator.cli import main
from orchestrator.storage import saved_queries as sq
from orchestrator.storage.query import run_query
from orchestrator.storage.writer import write_run


def _latecomer(run_id: str, seed: int):
    ingest = make_run_ingest(run_id, n_packets=1_000, seed=seed)
    flows = [{**f, "start_s": 5.0 * f["flow_id"]} for f in ingest.flows]
    return dataclasses.replace(ingest, flows=flows)


def _jain(ingest) -> float:
    g = [a["bytes"].sum() * 8 / (a["end_s"].max() - a["start_s"].min()) for _, a in ingest.iperf_intervals]
    return sum(g) ** 2 / (len(g) * sum(x * x for x in g))


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(["query", *argv])
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_every_saved_query_runs_with_its_defaults(engine, db_url) -> None:
    write_run(engine, make_run_ingest("sq-0001", n_packets=1_000))
    for query in sq.QUERIES.values():
        cols, _ = run_query(db_url, query.sql, sq.bind(query, {}))
        assert cols, query.name


def test_latecomer_fairness_finds_only_runs_with_staggered_starts(engine, db_url, capsys) -> None:
    late = [_latecomer("late-0001", 1), _latecomer("late-0002", 2)]
    for ingest in [*late, make_run_ingest("same-start", n_packets=1_000, seed=3)]:
        write_run(engine, ingest)
    code, out, _ = _cli(capsys, "--name", "latecomer-fairness", "--param", "plan=quickstart", "--db", db_url, "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["runs"] == 2 and row["plan_name"] == "quickstart"
    expected = [_jain(i) for i in late]
    assert row["jain_mean"] == pytest.approx(sum(expected) / 2)
    assert row["jain_min"] == pytest.approx(min(expected))
    code, out, _ = _cli(capsys, "--name", "latecomer-fairness", "--param", "min_flows=3", "--db", db_url, "--json")
    assert code == 0 and json.loads(out) == []


def test_runs_and_qdelay_by_variant(engine, db_url, capsys) -> None:
    write_run(engine, make_run_ingest("rq-0001", n_packets=1_000))
    write_run(engine, make_run_ingest("rq-0002", n_packets=1_000, status="failed"))
    code, out, _ = _cli(capsys, "--name", "runs", "--param", "status=failed", "--db", db_url, "--json")
    assert code == 0 and [r["run_id"] for r in json.loads(out)] == ["rq-0002"]
    code, out, _ = _cli(capsys, "--name", "qdelay-by-variant", "--db", db_url)
    assert code == 0 and "vanilla-6.1" in out and "(1 row)" in out


def test_bad_names_and_parameters_are_named(db_url, engine, capsys) -> None:
    code, _, err = _cli(capsys, "--name", "nope", "--db", db_url)
    assert code == 2 and "--name 'nope'" in err and "latecomer-fairness" in err
    code, _, err = _cli(capsys, "--name", "runs", "--param", "limit=ten", "--db", db_url)
    assert code == 2 and "--param limit='ten'" in err and "an integer" in err
    code, _, err = _cli(capsys, "--name", "runs", "--param", "colour=red", "--db", db_url)
    assert code == 2 and "--param colour" in err
    code, _, err = _cli(capsys, "--name", "runs", "--param", "plan", "--db", db_url)
    assert code == 2 and "NAME=VALUE" in err


def test_parameters_are_bound_never_spliced(engine, db_url) -> None:
    write_run(engine, make_run_ingest("bd-0001", n_packets=1_000))
    query = sq.saved_query("runs")
    _, rows = run_query(db_url, query.sql, sq.bind(query, {"plan": "quickstart' OR '1'='1"}))
    assert rows == []
    _, rows = run_query(db_url, query.sql, sq.bind(query, {"plan": "quickstart"}))
    assert [r[0] for r in rows] == ["bd-0001"]
