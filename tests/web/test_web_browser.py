"""The pages as people see them: the real server, Debian's Chromium driven by Playwright (never `playwright
install`: the browser is the `chromium` apt package `make setup` installs). Checked: a campaign's run list loads,
a filter narrows it (count and URL change), paging moves; a run's detail page draws its plots (plotly SVG, traces,
the event's red line and label), no console error; a campaign page shows the verdict table and a trend plot.
A screenshot of each page is saved in the test's tmp dir."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.web.webdata import CAMPAIGN, EXTRA_RUNS, NIGHTS, PHYSICS_RUN, REPS, VARIANTS

CHROMIUM = os.environ.get("TCPLAB_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:           # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = [
    pytest.mark.skipif(sync_playwright is None, reason="playwright not installed (pip install -e '.[test]')"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"chromium not installed ({CHROMIUM}; Debian package "
                       "`chromium`, installed by `make setup`)"),
]


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("requestfailed", lambda r: pg.errors.append(f"request failed: {r.url}"))
    yield pg
    ctx.close()


def _count(page) -> int:
    return int(page.locator("#count strong").inner_text())


def test_campaign_run_list_filters_and_pages(server, page, tmp_path):
    page.goto(f"{server}/?campaign={CAMPAIGN}&size=20")
    total = NIGHTS * REPS * len(VARIANTS)
    assert _count(page) == total
    assert page.locator("#runs tbody tr").count() == 20
    page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
    # the night drop-down narrows the list and lands in the URL
    page.select_option("select[name=night]", "2")
    page.wait_for_url(re.compile(r"night=2"))
    assert _count(page) == REPS * len(VARIANTS)
    assert "campaign=" + CAMPAIGN in page.url and "plan=" not in page.url       # empty fields stay out
    # a kernel variant filter on top
    page.select_option("select[name=variant]", "long-queue")
    page.wait_for_url(re.compile(r"variant=long-queue"))
    assert _count(page) == REPS
    assert all("long-queue" in t for t in page.locator("#runs tbody td:nth-child(8)").all_inner_texts())
    # paging over every run, 20 a page
    page.goto(f"{server}/?size=20")
    first = page.locator("#runs .run-link").all_inner_texts()
    page.locator(".pager a.next").first.click()
    page.wait_for_url(re.compile(r"page=2"))
    second = page.locator("#runs .run-link").all_inner_texts()
    assert len(second) == 20 and not set(first) & set(second)
    assert "page 2 of" in page.locator(".pageinfo").first.inner_text()
    assert _count(page) == 1 + total + EXTRA_RUNS
    assert page.errors == []


def test_run_detail_draws_its_plots_with_the_event(server, page, tmp_path):
    page.goto(f"{server}/run/{PHYSICS_RUN}")
    # (no wait_for_function: the page's CSP forbids the eval it needs)
    page.wait_for_selector("body[data-plots]", state="attached", timeout=60_000)
    assert page.get_attribute("body", "data-plots") == "ready", page.locator("#plot-status").inner_text()
    for pid, traces in (("throughput", 3), ("qdelay", 1), ("cwnd", 2), ("backlog", 1)):
        plot = page.locator(f"#plot-{pid}")
        assert plot.locator("svg.main-svg").count() >= 1, pid
        assert plot.locator("g.trace.scatter").count() == traces, pid
        # the set_rate event: a red dotted line (a layout shape) and its label
        assert plot.locator("g.shapelayer path").count() >= 1, pid
        assert "set_rate 10mbit" in " ".join(plot.locator("g.annotation").all_text_contents()), pid
    assert page.locator("#metrics-body tr").count() >= 10
    assert "all_flows_active" in page.locator("#window").inner_text()
    assert page.locator("#artifacts tbody tr").count() == 2
    assert page.locator("#hosts tbody tr").count() == 3
    # a tag holding markup is shown as text, never run
    assert page.locator(".chips span", has_text="<script>alert(1)</script>").count() == 1
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    assert page.errors == []


def test_campaign_page_verdicts_and_trend(server, page, tmp_path):
    page.goto(f"{server}/campaign/{CAMPAIGN}")
    page.wait_for_selector("body[data-plots=ready]", state="attached", timeout=60_000)
    assert page.locator("#nights tbody tr").count() == NIGHTS
    assert f"night {NIGHTS}" in page.locator("#verdicts-title").inner_text()
    verdicts = page.locator("#verdicts tbody td.REGRESSION")
    assert verdicts.count() == 1
    trends = page.locator("div.trend")
    assert trends.count() == 2                                   # one per checked metric
    qd = page.locator("div.trend[data-metric=qdelay_median]")
    assert qd.locator("g.trace.scatter").count() == len(VARIANTS)
    assert qd.locator("g.trace.scatter").first.locator("path.point").count() == NIGHTS
    assert "<b>" in page.locator("main > p").first.inner_text()            # the description is text
    page.screenshot(path=str(tmp_path / "campaign.png"), full_page=True)
    # the night's runs link leads to the filtered run list
    page.locator("#nights a.night-runs").nth(3).click()
    page.wait_for_url(re.compile(r"night=4"))
    assert _count(page) == REPS * len(VARIANTS)
    assert page.errors == []
