"""orchestrator.storage.query: read-only ad-hoc SQL on both backends, and answer formatting."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import re

import pytest
from dbdata import make_run_ingest, snapshot

from orchestrator.storage.query import QueryError, format_rows, run_query
from orchestrator.storage.writer import write_run

WRITES = [
    "DELETE FROM run",
    "UPDATE run SET status = 'failed'",
    "INSERT INTO plan (plan_sha256, name, path, text, created_at) VALUES ('x', 'n', 'p', 't', "
    "'2024-01-01')",
    "CREATE TABLE scratch (a integer)",
    "DROP TABLE packet",
]


@pytest.fixture
def filled(engine, db_url) -> str:
    write_run(engine, make_run_ingest("q-0001", n_packets=1_000, seed=1))
    write_run(engine, make_run_ingest("q-0002", n_packets=500, seed=2, status="failed"))
    return db_url


def test_select_returns_columns_and_rows(filled) -> None:
    columns, rows = run_query(filled, "SELECT run_id, status, (SELECT count(*) FROM packet p "
                                      "WHERE p.run_key = r.run_key) AS packets FROM run r ORDER BY run_id")
    assert columns == ["run_id", "status", "packets"]
    assert rows == [("q-0001", "complete", 1_000), ("q-0002", "failed", 500)]


def test_percent_and_colon_in_sql_are_not_placeholders(filled) -> None:
    _, rows = run_query(filled, "SELECT count(*) FROM run WHERE run_id LIKE 'q-%' AND 'a:b' <> ':x'")
    assert rows == [(2,)]


@pytest.mark.parametrize("sql", WRITES)
def test_writes_are_refused_and_change_nothing(filled, engine, sql) -> None:
    before = snapshot(engine)
    with pytest.raises(QueryError, match="read-only"):
        run_query(filled, sql)
    assert snapshot(engine) == before


def test_chained_statements_are_refused(filled, engine) -> None:
    before = snapshot(engine)
    # On PostgreSQL a COMMIT would end the read-only transaction; a second statement never runs.
    for sql in ("SELECT 1; DELETE FROM run", "COMMIT; DELETE FROM run"):
        with pytest.raises(QueryError):
            run_query(filled, sql)
    assert snapshot(engine) == before


def test_sql_errors_are_query_errors(filled) -> None:
    with pytest.raises(QueryError, match="SQL error"):
        run_query(filled, "SELECT nope FROM run")


def test_default_url_from_env(filled, monkeypatch) -> None:
    monkeypatch.setenv("TCPLAB_DB", filled)
    assert run_query(None, "SELECT count(*) FROM run")[1] == [(2,)]


def test_missing_sqlite_file_is_an_error_and_not_created(tmp_path) -> None:
    path = tmp_path / "nothing.db"
    with pytest.raises(QueryError, match="no SQLite database"):
        run_query(f"sqlite:///{path}", "SELECT 1")
    assert not path.exists()


def test_sqlite_path_with_uri_characters(tmp_path, make_ingest) -> None:
    from orchestrator.storage.db import open_db
    url = f"sqlite:///{tmp_path}/odd #name.db"  # "#" would end the path in a file: URI
    eng = open_db(url)
    write_run(eng, make_ingest("u-0001", n_packets=10))
    eng.dispose()
    assert run_query(url, "SELECT run_id FROM run")[1] == [("u-0001",)]


@pytest.mark.postgres
def test_unreachable_postgresql_is_a_query_error() -> None:
    with pytest.raises(QueryError, match="cannot connect"):
        run_query("postgresql://postgres@127.0.0.1:1/none", "SELECT 1")


# --- formatting --------------------------------------------------------------------------------------

COLUMNS = ["run_id", "packets", "rate", "params", "at", "note"]
ROWS = [("a-1", 12, 1.5, {"aqm": "pie"}, dt.datetime(2024, 1, 2, 3, 4, 5), None),
        ("bbbbbb-2", 3_000_000, decimal.Decimal("2.25"), [1, 2], dt.date(2024, 5, 6), "x")]


def test_format_rows_json_is_a_list_of_objects() -> None:
    got = json.loads(format_rows(COLUMNS, ROWS, as_json=True))
    assert got == [
        {"run_id": "a-1", "packets": 12, "rate": 1.5, "params": {"aqm": "pie"},
         "at": "2024-01-02T03:04:05", "note": None},
        {"run_id": "bbbbbb-2", "packets": 3_000_000, "rate": 2.25, "params": [1, 2],
         "at": "2024-05-06", "note": "x"},
    ]
    assert json.loads(format_rows(["n"], [], as_json=True)) == []


def test_format_rows_text_aligns_columns() -> None:
    lines = format_rows(COLUMNS, ROWS).splitlines()
    assert lines[0].split() == COLUMNS
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[-1] == "(2 rows)"
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    cells = [[line[a:b] for a, b in spans] for line in lines[2:4]]
    assert [c.strip() for c in cells[0]] == ["a-1", "12", "1.5", '{"aqm": "pie"}', "2024-01-02 03:04:05",
                                              "NULL"]
    assert [c.strip() for c in cells[1]] == ["bbbbbb-2", "3000000", "2.25", "[1, 2]", "2024-05-06", "x"]
    # Numbers are right-aligned, text left-aligned, within the same column widths.
    assert cells[0][1] == "     12" and cells[0][2] == " 1.5"
    assert cells[0][0] == "a-1     "
    assert format_rows(["n"], []).splitlines()[-1] == "(0 rows)"
