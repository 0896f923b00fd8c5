"""A campaign's page (`tcplab campaign report`, docs/campaigns.md): its nights, the last night's verdict table, the
evidence behind every verdict (samples, estimate, CI, test, adjusted p), and per check a trend plot of the nightly
medians of every cell and variant, with the change points the trend checks found.

`campaign_page` is pure (rows in, HTML out); the loaders read the campaign tables.
"""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from sqlalchemy import select
from sqlalchemy.engine import Engine

from analysis.compare import METRIC_BY_KEY
from analysis.report import _img, fmt_cell
from orchestrator.storage.campaign_tables import campaign, campaign_run, campaign_verdict, trial, trial_metric

STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1400px} table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px} td.num{text-align:right}
.REGRESSION{background:#f8d0d0;font-weight:bold} .PASS{background:#d6f0d6} .INCONCLUSIVE{background:#f6ecc8}
.NODATA{background:#ddd} .note{color:#555;font-size:12px} details{margin:.3em 0}"""


def load_nights(engine: Engine, name: str) -> list[dict[str, Any]]:
    """The campaign's nights (campaign_run rows) in night order."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(campaign_run).where(campaign_run.c.campaign == name)
                                                        .order_by(campaign_run.c.night))]


def load_verdicts(engine: Engine, name: str, night: int | None = None) -> tuple[dict, list[dict]] | None:
    """The last finished night (or night `night`) and its verdict rows."""
    done = [n for n in load_nights(engine, name) if n["status"] == "done" and (night is None or n["night"] == night)]
    if not done:
        return None
    n = done[-1]
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(
            select(campaign_verdict).where(campaign_verdict.c.campaign_run_id == n["id"])
            .order_by(campaign_verdict.c.check_index, campaign_verdict.c.variant))]
    for r in rows:
        r["cell_label"] = (r["detail"] or {}).get("cell_label", r["cell_key"][:12])
    return n, rows


def nightly_medians(engine: Engine, night_ids: Sequence[int]) -> dict[tuple[str, str, str], dict[int, float]]:
    """(metric, cell label, variant) -> night id -> median of the ok trials' values that night."""
    stmt = (select(trial.c.campaign_run_id, trial.c.cell_label, trial.c.variant, trial_metric.c.metric,
                   trial_metric.c.value)
            .join(trial_metric, trial_metric.c.trial_id == trial.c.id)
            .where(trial.c.campaign_run_id.in_(list(night_ids)), trial.c.status == "ok"))
    vals: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    with engine.connect() as conn:
        for night_id, label, variant, metric, value in conn.execute(stmt):
            if value is not None:
                vals.setdefault((metric, label, variant), {}).setdefault(night_id, []).append(value)
    return {k: {n: float(np.median(v)) for n, v in per.items()} for k, per in vals.items()}


def verdict_estimate(row: dict) -> Any:
    """The number a verdict row shows: the ratio (relative), the candidate's median (absolute), the step (trend)."""
    d = row["detail"] or {}
    return d.get("ratio") if row["kind"] == "relative" else d.get("median_cand") if row["kind"] == "absolute" \
        else d.get("step")


def change_points(rows: Sequence[dict], numbers: dict[int, int]) -> dict[tuple[str, str], list[int]]:
    """(cell label, variant) -> the change points (night ids; `numbers`: night id -> night) the night's trend
    checks found, among the nights shown."""
    return {(r["cell_label"], r["variant"]): [k for k in ((r["detail"] or {}).get("change_points") or [])
                                              if k in numbers]
            for r in rows if r["kind"] == "trend"}


def trend_series(medians: dict[tuple[str, str, str], dict[int, float]], rows: Sequence[dict]
                 ) -> dict[str, dict[tuple[str, str], dict[int, float]]]:
    """metric -> (cell label, variant) -> night id -> median: one trend plot per checked metric (every metric
    with values when the night has no verdicts)."""
    checked = list(dict.fromkeys(r["metric"] for r in rows)) or sorted({m for m, _, _ in medians})
    out = {}
    for metric in checked:
        series = {(label, variant): per for (m, label, variant), per in medians.items() if m == metric}
        if series:
            out[metric] = series
    return out


def trend_png(metric: str, series: dict[tuple[str, str], dict[int, float]], nights: dict[int, int],
              change_points: dict[tuple[str, str], list[int]]) -> bytes:
    """One line per (cell, variant): nightly medians over night numbers; change points as vertical marks."""
    import io

    fig = Figure(figsize=(9, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    for (label, variant), per in sorted(series.items()):
        xs = sorted(per)
        line = ax.plot([nights[x] for x in xs], [per[x] for x in xs], marker="o", ms=3,
                       label=f"{variant}: {label}"[:70])
        for cp in change_points.get((label, variant), []):
            if cp in nights:
                ax.axvline(nights[cp] - 0.5, color=line[0].get_color(), ls=":", lw=1.2)
    m = METRIC_BY_KEY.get(metric)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("night")
    ax.set_ylabel(f"{m.name} ({m.unit})" if m else metric)
    ax.set_title(f"{metric}: nightly median per cell and variant" + (f" ({m.better} is better)" if m and m.better
                                                                    else ""))
    ax.legend(fontsize=6, loc="best")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return buf.getvalue()


def fmt_value(v: Any) -> str:
    if isinstance(v, list | tuple):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, float) and not math.isnan(v):
        return f"{v:.4g}"
    return fmt_cell(v)


def verdict_table(rows: Sequence[dict]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("check", "metric", "kind", "cell", "variant", "estimate", "CI",
                                              "p adj.", "verdict"))
    body = []
    for r in rows:
        d = r["detail"] or {}
        est = verdict_estimate(r)
        cls = r["verdict"].replace(" ", "")
        body.append(f"<tr><td>{r['check_index']}</td><td>{html.escape(r['metric'])}</td><td>{r['kind']}</td>"
                    f"<td>{html.escape(r['cell_label'])}</td><td>{html.escape(r['variant'])}</td>"
                    f"<td class=num>{fmt_value(est)}</td><td class=num>{fmt_value(d.get('ci'))}</td>"
                    f"<td class=num>{fmt_value(d.get('p_adjusted'))}</td><td class='{cls}'>{r['verdict']}</td></tr>")
    return f"<table class=verdicts><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def evidence(rows: Sequence[dict]) -> str:
    """Per verdict: every number it was decided on."""
    out = []
    for r in rows:
        d = {k: v for k, v in (r["detail"] or {}).items() if k != "cell_label"}
        items = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(fmt_value(v))}</td></tr>" for k, v in d.items())
        out.append(f"<details><summary>check {r['check_index']} {html.escape(r['metric'])} ({r['kind']}) · "
                   f"{html.escape(r['cell_label'])} · {html.escape(r['variant'])}: <span class='"
                   f"{r['verdict'].replace(' ', '')}'>{r['verdict']}</span></summary><table>{items}</table></details>")
    return "\n".join(out)


def campaign_page(name: str, description: str, nights: Sequence[dict], last: dict | None, rows: Sequence[dict],
                  plots: dict[str, bytes], generated: str) -> str:
    night_rows = "".join(
        f"<tr><td class=num>{n['night']}</td><td>{html.escape(n['label'])}</td><td>{n['status']}</td>"
        f"<td class=num>{fmt_cell(n['exit_code'])}</td><td>{html.escape(summary_text(n.get('summary')))}</td></tr>"
        for n in nights)
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>campaign {html.escape(name)}</title>"
             f"<style>{STYLE}</style></head><body><h1>campaign {html.escape(name)}</h1>",
             f"<p>{html.escape(description)}</p><p class=note>generated {generated}</p>",
             "<h2>Nights</h2><table class=nights><thead><tr><th>night</th><th>label</th><th>status</th>"
             f"<th>exit code</th><th>summary</th></tr></thead><tbody>{night_rows}</tbody></table>"]
    if last is not None:
        parts += [f"<h2>Verdicts of night {last['night']} ({html.escape(last['label'])})</h2>",
                  "<p class=note>relative: ratio of medians (candidate / baseline) with its bootstrap CI, exact "
                  "Mann-Whitney p adjusted by Benjamini-Hochberg across the night's checks; absolute: the "
                  "candidate's median against the bound; trend: the last change point's relative step.</p>",
                  verdict_table(rows), "<h2>Evidence</h2>", evidence(rows)]
    parts.append("<h2>Trends</h2>")
    parts += [f"<h3>{html.escape(metric)}</h3>{_img(png, f'trend of {metric}')}" for metric, png in plots.items()]
    return "\n".join(parts) + "</body></html>\n"


def summary_text(summary: Any) -> str:
    if not isinstance(summary, dict):
        return ""
    v = ", ".join(f"{k} {n}" for k, n in sorted((summary.get("verdicts") or {}).items()))
    t = ", ".join(f"{k} {n}" for k, n in sorted((summary.get("trials") or {}).items()))
    return f"verdicts: {v or '-'}; trials: {t or '-'}"


def write_campaign_report(engine: Engine, name: str, out_dir: Path) -> Path | None:
    with engine.connect() as conn:
        row = conn.execute(select(campaign).where(campaign.c.name == name)).first()
    nights = load_nights(engine, name)
    if row is None or not nights:
        return None
    import yaml

    description = (yaml.safe_load(row.text) or {}).get("description", "") if row.text else ""
    found = load_verdicts(engine, name)
    last, rows = found if found is not None else (None, [])
    numbers = {n["id"]: n["night"] for n in nights}
    medians = nightly_medians(engine, list(numbers))
    cps = change_points(rows, numbers)
    plots = {metric: trend_png(metric, series, numbers, cps)
             for metric, series in trend_series(medians, rows).items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"campaign-{name}.html"
    path.write_text(campaign_page(name, description, nights, last, rows, plots,
                                  datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")))
    return path
