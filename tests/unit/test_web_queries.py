"""`tcplab serve`'s pure parts: the run-list filter from URL parameters, the SQL it becomes (bounded, indexed
columns, parameters bound, never a per-packet table), the JSON a plot travels in, plot decimation, the read-only
SQLite URI."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from sqlalchemy.dialects import sqlite

from analysis.events import EventMark
from orchestrator.web import queries as q
from orchestrator.web.app import _json_script
from orchestrator.web.db import sqlite_ro_uri
from orchestrator.web.figures import MAX_POINTS, decimate, event_layout, line


def _sql(stmt) -> str:
    return str(stmt.compile(dialect=sqlite.dialect()))


def test_filter_parse_defaults_and_bad_values():
    f, problems = q.RunFilter.parse({})
    assert f == q.RunFilter() and problems == []
    f, problems = q.RunFilter.parse({"plan": " quickstart ", "size": "100000", "page": "x", "sort": "nope",
                                     "night": "0"})
    assert f.plan == "quickstart" and f.size == q.MAX_PAGE_SIZE and f.page == 1 and f.sort == "time"
    assert f.night == 1
    assert len(problems) == 4 and any("size" in p for p in problems)


def test_filter_query_string_keeps_only_what_is_set():
    f, _ = q.RunFilter.parse({"campaign": "nightly", "night": "3", "size": "20"})
    assert f.query() == "campaign=nightly&night=3&size=20"
    assert f.query(page=2) == "campaign=nightly&night=3&page=2&size=20"
    assert f.active == {"campaign": "nightly", "night": "3"}


def test_run_select_is_bounded_and_touches_no_per_packet_table():
    f, _ = q.RunFilter.parse({"plan": "p", "experiment": "e", "status": "complete", "tag": "smoke",
                              "variant": "v", "release": "r", "campaign": "c", "night": "2", "page": "3",
                              "size": "20", "sort": "time-asc"})
    sql = _sql(q.run_select(f))
    assert "LIMIT ? OFFSET ?" in sql
    for t in ("packet", "qdelay", "tcp_probe", "qdisc_sample", "ss_sample"):
        assert f" {t}" not in sql.replace("run_key", "")
    assert "EXISTS" in sql and "run_host" in sql and "campaign_run" in sql
    params = q.run_select(f).compile().params
    assert 40 in params.values() and 20 in params.values()           # offset (page 3 of 20), limit
    assert "p" in params.values()                                     # bound, never pasted into the SQL


def test_tag_condition_escapes_like_wildcards():
    cond = q.tag_condition('50%_"x')
    params = cond.compile().params
    # json.dumps writes the quote as \", and the backslash is escaped for LIKE in turn
    assert list(params.values()) == ['%"50\\%\\_\\\\"x"%']


def test_compact_kernels():
    assert q.compact_kernels(["a: v 6.1", "b: v 6.1"]) == ["2 hosts: v 6.1"]
    assert q.compact_kernels(["a: v 6.1", "b: w 6.2"]) == ["a: v 6.1", "b: w 6.2"]


def test_json_script_cannot_end_its_script_element():
    text = _json_script({"tag": "</script><script>alert(1)</script>", "amp": "&"})
    assert "<" not in text and ">" not in text and "&" not in text


def test_decimate_keeps_long_series_small_and_means_right():
    t = np.arange(100_000) * 0.01
    y = t * 2.0
    tt, yy = decimate(t, y)
    k = 100_000 // tt.size
    assert tt.size <= MAX_POINTS + 1 and yy[0] == np.mean(y[:k]) and tt[1] == t[k]
    trace = line("x", t[:10], np.array([1, np.nan, 2, 3, 4, 5, 6, 7, 8, 9.0]))
    assert trace["y"][1] is None and len(trace["x"]) == 10


def test_event_marks_become_shapes_and_labels():
    lay = event_layout([EventMark(2.5, "set_rate 10mbit"), EventMark(1.0, "ack_blackout", end_s=1.5)])
    assert len(lay["shapes"]) == 3 and [a["text"] for a in lay["annotations"]] == ["set_rate 10mbit", "ack_blackout"]


def test_sqlite_ro_uri(tmp_path: Path):
    uri = sqlite_ro_uri(tmp_path / "a b#.db")
    assert uri.startswith("file:/") and uri.endswith("?mode=ro") and " " not in uri and "#" not in uri
