"""Page assembly for `tcplab serve`: each function reads what one page needs (bounded) and returns the template's
context; no HTML here (templates escape every value), no writes anywhere.

Run analysis reuses the report's code: analysis/load.iter_runs -> analysis/runstats.analyse ->
analysis/report.run_series, the campaign page analysis/campaign_report's loaders, compare analysis/compare.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from threading import Lock
from typing import Any

from sqlalchemy.engine import Engine

from analysis import campaign_report as cr
from analysis.compare import METRICS, SIGNIFICANCE, compare, metric_values
from analysis.load import iter_runs
from analysis.report import fmt_cell, run_series
from analysis.runstats import analyse
from analysis.select import SelectorError, select
from orchestrator.web import queries as q
from orchestrator.web.figures import run_figures, trend_figure

MAX_COMPARE_RUNS = 40
"""Runs per side `/compare` analyses (each is loaded with its packets); a larger selection is refused."""
FIGURE_CACHE = 8
"""Analysed runs kept in memory (keyed by run id, run key and finish time: a re-ingested run is analysed again)."""


class NotFound(LookupError):
    """What the URL names is not in the database (the page says which)."""


def run_list(engine: Engine, params: Mapping[str, str]) -> dict[str, Any]:
    f, problems = q.RunFilter.parse(params)
    with engine.connect() as conn:
        page = q.run_page(conn, f)
        opts = q.choices(conn, f)
    return {"f": f, "problems": problems, "page": page, "pages": page.pages(f.size), "choices": opts,
            "sizes": (20, 50, 100, q.MAX_PAGE_SIZE), "sorts": q.SORTS,
            "first": (f.page - 1) * f.size + 1 if page.rows else 0, "last": (f.page - 1) * f.size + len(page.rows)}


def run_page(engine: Engine, run_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        found = q.run_detail(conn, run_id)
    if found is None:
        raise NotFound(f"no run {run_id!r} in the database")
    return found


class _FigureCache:
    def __init__(self, size: int) -> None:
        self._items: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
        self._size = size
        self._lock = Lock()

    def get(self, key: tuple) -> dict[str, Any] | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, key: tuple, value: dict[str, Any]) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_figures = _FigureCache(FIGURE_CACHE)


def _number(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def run_figure_data(engine: Engine, run_id: str) -> dict[str, Any]:
    """The run's plots (plotly specs), its window metrics and the analysis notes (JSON for /run/ID/figures.json)."""
    with engine.connect() as conn:
        detail = q.run_detail(conn, run_id)
    if detail is None:
        raise NotFound(f"no run {run_id!r} in the database")
    run = detail["run"]
    key = (run_id, run["run_key"], str(run["finished_at"]))
    cached = _figures.get(key)
    if cached is not None:
        return cached
    data = next(iter(iter_runs(engine, [run_id], detail=True)))
    result = analyse(data)
    series = run_series(data, result.row)
    w = result.window
    out = {
        "figures": run_figures(result, series),
        "metrics": [{"key": m.key, "name": m.name, "unit": m.unit, "value": _number(v)}
                    for m, v in zip(METRICS, metric_values(result).values(), strict=True)],
        "window": {"rule": w.rule, "start_s": _number((w.start_ns - result.t0_ns) / 1e9) if result.t0_ns else None,
                   "length_s": _number(w.length_ns / 1e9)},
        "notes": list(result.notes)[:50],
        "events": [{"t_s": e.t_s, "label": e.label} for e in series.events],
    }
    _figures.put(key, out)
    return out


def plan_page(engine: Engine, name: str) -> dict[str, Any]:
    with engine.connect() as conn:
        found = q.plan_summary(conn, name)
    if found is None:
        raise NotFound(f"no plan {name!r} in the database")
    totals: dict[str, int] = {}
    for c in found["counts"]:
        totals[c["status"]] = totals.get(c["status"], 0) + c["runs"]
    return found | {"totals": totals}


def index_lists(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {"plans": q.plan_names(conn), "campaigns": q.campaign_names(conn)}


def _evidence_items(detail: dict[str, Any] | None) -> list[tuple[str, str]]:
    return [(k, cr.fmt_value(v)) for k, v in (detail or {}).items() if k != "cell_label"]


def campaign_page(engine: Engine, name: str, night: int | None = None) -> dict[str, Any]:
    """Nights, the verdicts of one night (default: the last finished) with their evidence, a trend plot per check."""
    with engine.connect() as conn:
        row = q.campaign_row(conn, name)
    if row is None:
        raise NotFound(f"no campaign {name!r} in the database")
    nights = cr.load_nights(engine, name)
    found = cr.load_verdicts(engine, name, night)
    shown, rows = found if found is not None else (None, [])
    numbers = {n["id"]: n["night"] for n in nights}
    medians = cr.nightly_medians(engine, list(numbers)) if numbers else {}
    cps = cr.change_points(rows, numbers)
    figures = {metric: trend_figure(metric, series, numbers, cps)
               for metric, series in cr.trend_series(medians, rows).items()}
    verdicts = [{"check": r["check_index"], "metric": r["metric"], "kind": r["kind"], "cell": r["cell_label"],
                 "variant": r["variant"], "estimate": cr.fmt_value(cr.verdict_estimate(r)),
                 "ci": cr.fmt_value((r["detail"] or {}).get("ci")),
                 "p_adj": cr.fmt_value((r["detail"] or {}).get("p_adjusted")),
                 "verdict": r["verdict"], "css": r["verdict"].replace(" ", ""),
                 "evidence": _evidence_items(r["detail"])} for r in rows]
    import yaml

    try:
        description = (yaml.safe_load(row["text"]) or {}).get("description", "") if row["text"] else ""
    except yaml.YAMLError:
        description = ""
    return {"name": name, "campaign": row, "description": str(description), "nights": nights,
            "summaries": {n["id"]: cr.summary_text(n.get("summary")) for n in nights}, "shown": shown,
            "verdicts": verdicts, "figures": figures, "asked_night": night}


def compare_page(engine: Engine, a: str, b: str) -> dict[str, Any]:
    """Both selectors resolved (each at most MAX_COMPARE_RUNS runs), analysed and compared; errors as values."""
    ctx: dict[str, Any] = {"a": a, "b": b, "rows": [], "error": "", "alpha": SIGNIFICANCE}
    if not a or not b:
        return ctx
    try:
        sizes = {s: len(select(engine, s).run_ids) for s in (a, b)}
    except SelectorError as exc:
        return ctx | {"error": str(exc)}
    big = {s: n for s, n in sizes.items() if n > MAX_COMPARE_RUNS}
    if big:
        return ctx | {"error": "; ".join(f"{s!r} names {n} runs: at most {MAX_COMPARE_RUNS} per side here "
                                         f"(use `tcplab compare` for larger selections)" for s, n in big.items())}
    sel_a, sel_b, rows = compare(engine, a, b)
    shown = []
    for r in rows:
        verdict = "" if math.isnan(r.p) else ("significant" if r.p < SIGNIFICANCE else "n.s.")
        shown.append({"metric": r.metric, "unit": r.unit, "mean_a": fmt_cell(r.mean_a), "mean_b": fmt_cell(r.mean_b),
                      "diff": fmt_cell(r.diff), "rel": "–" if math.isnan(r.rel) else f"{100 * r.rel:+.1f}",
                      "p": "–" if math.isnan(r.p) else f"{r.p:.3g}", "verdict": verdict,
                      "a": ", ".join(fmt_cell(v) for v in r.a[:12]), "b": ", ".join(fmt_cell(v) for v in r.b[:12])})
    return ctx | {"sel_a": sel_a, "sel_b": sel_b, "rows": shown}
