"""The study page (`study-NAME.html`) and its CSV: every table in the paper's layout, the paper's value and the
measured one side by side in each cell with its verdict, a plot per table in the paper's form (the paper's
values as bars, the measured ones beside them with their repetitions' spread), and what the testbed could not
reproduce and why. Reads the database; the cells and verdicts are study/cells.py's."""
from __future__ import annotations

import base64
import csv
import html
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine

from analysis.compare import METRICS, run_metric_values
from orchestrator.study.cells import NOT_MEASURED, NOT_REPRODUCIBLE, OUT, WITHIN, CellResult, Erased, table_cells

# queue delays are times of the path: a profile that stretched them (keep: bdp) is undone before comparing
TIME_METRICS = frozenset(m.key for m in METRICS if m.key.startswith("qdelay_"))
VERDICT_CLASS = {WITHIN: "ok", OUT: "out", NOT_REPRODUCIBLE: "na", NOT_MEASURED: "nm"}


@dataclass(frozen=True)
class StudyResults:
    cells: list[CellResult]
    erased: list[Erased]
    runs: int           # selected runs
    complete: int       # of them stored complete
    refused: int


def stored_status(engine: Engine, run_ids: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    """run id -> (status, error) of the runs among `run_ids` the database holds (chunked IN lists)."""
    out: dict[str, tuple[str, str | None]] = {}
    ids = list(run_ids)
    with engine.connect() as c:
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ", ".join(f":r{j}" for j in range(len(chunk)))
            rows = c.execute(text(f"SELECT run_id, status, error FROM run WHERE run_id IN ({marks})"),
                             {f"r{j}": r for j, r in enumerate(chunk)})
            out.update({r.run_id: (r.status, r.error) for r in rows})
    return out


def study_results(loaded, engine: Engine, erased: Mapping[str, list[Erased]]) -> StudyResults:
    every = [s for sp in loaded.plans.values() for s in sp.runs]
    status = stored_status(engine, [s.run_id for s in every])
    complete = [r for r, (st, _) in status.items() if st == "complete"]
    refused = {r: (err or "refused") for r, (st, err) in status.items() if st == "refused"}
    values = run_metric_values(engine, complete) if complete else {}
    cells = []
    for table in loaded.study.tables:
        cells += table_cells(table, loaded.plans[table.plan].runs, values, refused, erased.get(table.plan, []),
                             TIME_METRICS)
    return StudyResults(cells, [e for es in erased.values() for e in es], len(every), len(complete), len(refused))


def _num(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def _plot(table, cells: list[CellResult]) -> str:
    """The table as grouped bars (paper, measured) per column, one panel per row; a base64 PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(table.rows), 1, figsize=(8, 2.2 * len(table.rows)), squeeze=False)
    for ax, row in zip(axes[:, 0], table.rows, strict=True):
        label = row.label
        mine = [c for c in cells if c.row == label]
        x = range(len(mine))
        ax.bar([i - 0.2 for i in x], [c.paper if c.paper is not None else math.nan for c in mine], 0.4,
               label="paper", color="#999999")
        ax.bar([i + 0.2 for i in x], [c.measured for c in mine], 0.4, label="measured", color="#1f77b4")
        ax.set_xticks(list(x), [c.column for c in mine])
        ax.set_title(label, fontsize=9)
        ax.set_ylabel(row.metric or table.unit or table.metric, fontsize=8)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _table_html(table, cells: list[CellResult]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(v)}</th>" for v in table.columns.values)
    body = []
    for row in table.rows:
        tds = []
        for c in (c for c in cells if c.row == row.label):
            title = e(f"{c.verdict}. {c.why}".strip(". ") + f" ({c.runs} runs)")
            tds.append(f'<td class="{VERDICT_CLASS.get(c.verdict, "")}" title="{title}">{_num(c.paper)}<br>'
                       f"<b>{_num(c.measured)}</b><br><small>{e(c.verdict)}</small></td>")
        body.append(f"<tr><th>{e(row.label)}</th>{''.join(tds)}</tr>")
    return (f"<h2>{e(table.title)}</h2><p>{e(table.source)}; metric {e(table.metric)}"
            f"{' in ' + e(table.unit) if table.unit else ''}, {e(table.statistic)} over repetitions; tolerance "
            f"max({table.tolerance.abs:g}, {table.tolerance.rel:.0%} of the paper). Each cell: paper / "
            f"<b>measured</b> / verdict.</p><table><tr><th></th>{head}</tr>{''.join(body)}</table>"
            f'<img alt="{e(table.id)}" src="data:image/png;base64,{_plot(table, cells)}">')


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}.ok{background:#d9f2d9}"
         ".out{background:#f9d6d5}.na{background:#e6e6e6}.nm{background:#fff6d5}")


def write_study(loaded, results: StudyResults, out: Path) -> tuple[Path, Path]:
    """study-NAME.html and study-NAME.csv (every cell) under `out`."""
    s, e = loaded.study, html.escape
    out.mkdir(parents=True, exist_ok=True)
    reasons = {}
    for c in results.cells:
        if c.verdict in (NOT_REPRODUCIBLE, NOT_MEASURED, OUT) and c.why:
            reasons.setdefault(c.verdict, {}).setdefault(c.why, 0)
            reasons[c.verdict][c.why] += 1
    why_html = "".join(f"<li><b>{e(v)}</b> ({n} cells): {e(why)}</li>" for v, whys in reasons.items()
                       for why, n in whys.items())
    erased = "".join(f"<li><b>{e(x.comparison)}</b>: {e(x.why)}</li>" for x in results.erased)
    parts = [f"<!doctype html><meta charset=utf-8><title>study {e(s.name)}</title><style>{STYLE}</style>",
             f"<h1>{e(s.title)}</h1><p>{e(s.reference)}</p><p>{e(s.notes)}</p>",
             f"<p>profile {e(loaded.profile.name)}; {results.runs} runs selected, {results.complete} stored "
             f"complete, {results.refused} refused.</p>"]
    if erased:
        parts.append(f"<h2>Not reproducible on this testbed</h2><ul>{erased}</ul>")
    for table in s.tables:
        parts.append(_table_html(table, [c for c in results.cells if c.table == table.id]))
    if why_html:
        parts.append(f"<h2>Why cells are not reproduced</h2><ul>{why_html}</ul>")
    page = out / f"study-{s.name}.html"
    page.write_text("".join(parts), encoding="utf-8")
    sheet = out / f"study-{s.name}.csv"
    with sheet.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(CellResult.__dataclass_fields__))
        w.writeheader()
        for c in results.cells:
            w.writerow(asdict(c))
    return page, sheet
