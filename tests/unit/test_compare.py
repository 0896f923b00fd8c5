"""Selectors, `tcplab report SELECTOR` and `tcplab compare A B` on a SQLite DB filled by the real ingest
writer with the DB-test data (tests/db/dbdata.py), no lab."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "db"))
from dbdata import make_run_ingest  # noqa: E402

from analysis import compare as cmp  # noqa: E402
from analysis.select import SelectorError, select, select_all  # noqa: E402
from orchestrator.cli import main  # noqa: E402
from orchestrator.storage.db import open_db  # noqa: E402
from orchestrator.storage.writer import write_run  # noqa: E402

RUNS = [  # run_id, plan, experiment, tags, status
    ("alpha-0", "alpha", "e1", ["smoke", "nightly"], "complete"),
    ("alpha-1", "alpha", "e1", ["smoke", "nightly"], "complete"),
    ("alpha-2", "alpha", "e2", ["smoke"], "complete"),
    ("beta-0", "beta", "e1", ["nightly2"], "complete"),
    ("beta-1", "beta", "e1", ["nightly2"], "complete"),
    ("beta-bad", "beta", "e1", ["nightly2"], "failed"),
]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('cmp') / 'tcplab.db'}"
    engine = open_db(url)
    for i, (run_id, plan, exp, tags, status) in enumerate(RUNS):
        ingest = make_run_ingest(run_id, n_packets=2_000, seed=i + 1, status=status)
        ingest.run.update(plan_name=plan, experiment=exp, tags=tags)
        write_run(engine, ingest)
    return url, engine


def test_selectors_resolve_by_kind_and_bare_name(db):
    _, engine = db
    assert select(engine, "alpha-1").run_ids == ("alpha-1",) and select(engine, "alpha-1").kind == "run"
    assert select(engine, "alpha").run_ids == ("alpha-0", "alpha-1", "alpha-2")
    assert select(engine, "plan:beta").run_ids == ("beta-0", "beta-1")            # failed run left out
    assert select(engine, "run:beta-bad").run_ids == ("beta-bad",)                # unless asked by id
    assert select(engine, "tag:nightly").run_ids == ("alpha-0", "alpha-1")        # a tag
    assert select(engine, "nightly2").kind == "tag"                               # bare tag
    assert select(engine, "experiment:beta/e1").run_ids == ("beta-0", "beta-1")
    assert select(engine, "e2").run_ids == ("alpha-2",)
    assert select_all(engine, ["alpha-2", "plan:alpha"]) == ["alpha-2", "alpha-0", "alpha-1"]
    for bad in ("nope", "plan:nope", "bogus:alpha", "run:"):
        with pytest.raises(SelectorError):
            select(engine, bad)


def test_compare_two_plans_welch_over_runs(db):
    _, engine = db
    sel_a, sel_b, rows = cmp.compare(engine, "plan:alpha", "plan:beta")
    assert (len(sel_a.run_ids), len(sel_b.run_ids)) == (3, 2)
    by = {r.metric: r for r in rows}
    assert set(by) == {m.name for m in cmp.METRICS}
    retx = by["retransmissions"]
    assert len(retx.a) == 3 and len(retx.b) == 2
    text = cmp.format_comparison(sel_a, sel_b, rows)
    assert "plan alpha (3 runs)" in text and "plan beta (2 runs)" in text and "Welch" in text


def test_compare_results_pure_numbers():
    """compare_results on stand-in analyses: means, difference and p by hand."""
    from types import SimpleNamespace as NS

    def run(goodput):
        row = NS(goodput_bps=goodput * 1e6)
        return NS(row=row, utilisation=None, qdelay=NS(mean=1e3, median=1e3, p99=2e3), flows=[], jain=float("nan"),
                  qdisc_drop_rate=0.01)

    rows = cmp.compare_results([run(1), run(2), run(3), run(4)], [run(3), run(4), run(5), run(6), run(7)])
    g = next(r for r in rows if r.metric == "goodput")
    assert (g.mean_a, g.mean_b, g.diff) == (2.5, 5.0, 2.5)
    assert g.rel == pytest.approx(1.0) and 0.03 < g.p < 0.04          # Welch: see test_metrics_studies
    q = next(r for r in rows if r.metric == "queue delay mean")
    assert q.mean_a == pytest.approx(1.0) and q.p != q.p                # no spread: no test (NaN)


def test_cli_compare_and_report_exit_codes(db, tmp_path, capsys):
    url, _ = db
    with pytest.raises(SystemExit) as done:
        main(["compare", "plan:alpha", "plan:nope", "--db", url])
    assert done.value.code == 2
    assert "plan:nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["compare", "alpha", "beta", "--db", url])
    assert done.value.code == 0
    assert "goodput" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["report", "nope", "--db", url, "--out", str(tmp_path / "r0")])
    assert done.value.code == 2
    with pytest.raises(SystemExit) as done:
        main(["report", "tag:nightly", "--db", url, "--out", str(tmp_path / "r1")])
    assert done.value.code == 0
    page = (tmp_path / "r1" / "report.html").read_text()
    tbody = page[page.index("<tbody>"):page.index("</tbody>")]
    assert re.findall(r"<td[^>]*>(alpha-\d)</td>", tbody) == ["alpha-0", "alpha-1"]
    with pytest.raises(SystemExit) as done:                     # `make demo`: no selector = all complete runs
        main(["report", "--db", url, "--out", str(tmp_path / "r2")])
    assert done.value.code == 0
    runs_csv = (tmp_path / "r2" / "runs.csv").read_text().splitlines()
    assert len(runs_csv) == 1 + 5
    assert (tmp_path / "r2" / "tables" / "flows.csv").exists()
