"""The pages without a browser (Starlette's TestClient over the read-only engine): every route answers, filters
count right, markup from the database is escaped, unknown names are 404 naming them, the database cannot be
written through the app's engine, no route accepts a write method."""
from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from orchestrator.web.db import ReadOnlyDbError, open_readonly
from tests.web.webdata import CAMPAIGN, EXTRA_RUNS, NIGHTS, PHYSICS_RUN, REPS, VARIANTS

TOTAL = 1 + NIGHTS * REPS * len(VARIANTS) + EXTRA_RUNS


def _count(html: str) -> int:
    return int(re.search(r'<p id="count"><strong>(\d+)</strong>', html).group(1))


@pytest.mark.parametrize("query, expected", [
    ("", TOTAL),
    (f"campaign={CAMPAIGN}", NIGHTS * REPS * len(VARIANTS)),
    (f"campaign={CAMPAIGN}&night=3", REPS * len(VARIANTS)),
    ("variant=long-queue", NIGHTS * REPS),
    ("release=6.1.0-99-amd64", NIGHTS * REPS),
    ("plan=other&status=failed", sum(1 for i in range(EXTRA_RUNS) if i % 5 == 3)),
    ("tag=nightly", NIGHTS * REPS * len(VARIANTS) + (EXTRA_RUNS + 1) // 2),
    ("tag=night", 0),                                # a tag is matched whole, not as a substring
    ("tag=%25", 0),                                  # LIKE wildcards are literal
])
def test_run_list_filters(client, query, expected):
    r = client.get(f"/?{query}")
    assert r.status_code == 200 and _count(r.text) == expected


def test_run_list_pages_and_sorts(client):
    ids = []
    for page in (1, 2, 3):
        html = client.get(f"/?size=20&page={page}&sort=id").text
        ids += re.findall(r'class="run-link" href="/run/[^"]+">([^<]+)</a>', html)
    assert len(ids) == min(60, TOTAL) and ids == sorted(ids) and len(set(ids)) == len(ids)
    newest = re.findall(r'class="run-link" href="/run/[^"]+">([^<]+)</a>', client.get("/?size=1").text)
    assert newest == ["nightly-web-n5-long-queue-r2a0"]        # the last trial of the last night
    assert "is not a whole number" in client.get("/?page=x").text


def test_markup_from_the_database_is_escaped(client):
    html = client.get(f"/run/{PHYSICS_RUN}").text
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>not bold</b>" not in client.get(f"/campaign/{CAMPAIGN}").text
    assert "<script>alert" not in client.get("/?tag=<script>alert(1)</script>").text


def test_run_detail_and_its_figures(client):
    html = client.get(f"/run/{PHYSICS_RUN}").text
    for part in ("set_rate", "aqm:to-client", "6.1.0-50-amd64", "1" * 64, "net.", "hello", "reset"):
        assert part in html, part
    data = client.get(f"/run/{PHYSICS_RUN}/figures.json").json()
    assert set(data["figures"]) == {"throughput", "qdelay", "cwnd", "backlog"}
    assert data["events"] == [{"t_s": pytest.approx(2.501), "label": "set_rate 10mbit"}]
    goodput = next(m["value"] for m in data["metrics"] if m["key"] == "goodput")
    assert 12 < goodput < 16                                  # 20 Mbit/s, then 10 from 2.5 s, both flows
    qd = data["figures"]["qdelay"]["data"][0]["y"]
    assert max(v for v in qd if v is not None) > 100          # the sawtooth doubles after the rate halves


def test_campaign_plan_compare_pages(client):
    html = client.get(f"/campaign/{CAMPAIGN}").text
    assert html.count('class="REGRESSION"') == 2               # table cell and evidence
    assert 'data-plot="trend-1"' in html and 'data-plot="trend-2"' in html
    night2 = client.get(f"/campaign/{CAMPAIGN}?night=2").text
    assert "Verdicts of night 2" in night2 and 'class="REGRESSION"' not in night2
    plan = client.get("/plan/quickstart").text
    assert "bottleneck:" in plan and "main" in plan
    cmp = client.get("/compare?a=plan:other&b=run:" + PHYSICS_RUN)
    assert cmp.status_code == 200 and "queue delay median" in cmp.text
    bad = client.get("/compare?a=plan:nope&b=plan:other")
    assert bad.status_code == 400 and "plan:nope" in bad.text


@pytest.mark.parametrize("path", ["/run/nope", "/plan/nope", "/campaign/nope", "/run/nope/figures.json"])
def test_unknown_names_are_404(client, path):
    r = client.get(path)
    assert r.status_code == 404 and "nope" in r.text


def test_no_route_accepts_a_write(client):
    for path in ("/", f"/run/{PHYSICS_RUN}", f"/campaign/{CAMPAIGN}", "/compare"):
        assert client.post(path).status_code == 405
        assert client.delete(path).status_code == 405


def test_served_page_needs_nothing_from_another_origin(client):
    r = client.get("/")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert not re.search(r'(src|href)="(https?:)?//', r.text)
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000


def test_the_engine_cannot_write(ro_engine, web_db):
    with pytest.raises(sa.exc.OperationalError, match="readonly|read-only|query_only"):
        with ro_engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM run"))
    with ro_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM run")).scalar() == TOTAL
    with pytest.raises(ReadOnlyDbError, match="no such database file"):
        open_readonly(f"sqlite:///{web_db.parent / 'absent.db'}")
    assert not (web_db.parent / "absent.db").exists()


@pytest.mark.postgres
def test_postgres_sessions_are_read_only(pg_url):
    from orchestrator.storage.db import open_db

    open_db(pg_url).dispose()
    engine = open_readonly(pg_url)
    try:
        with pytest.raises(sa.exc.InternalError, match="read-only transaction"):
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM run"))
    finally:
        engine.dispose()
