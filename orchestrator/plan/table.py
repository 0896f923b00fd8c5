"""`tcplab plan table`: the study-style parameter table of a plan (pure).

Rows are parameters (the values the plan varies, then derived ones), columns are experiments, as in the
studies' own tables (LS-AIMD Table 5.1: columns 1, 2, 3A ... 4H). A value that differs between the arms
of an experiment gets one row per group of arms that share it, labelled with the arms' common name prefix
(`red_min_bytes [dctcp-step-*]`); a value that varies inside one arm (a matrix within the experiment)
lists its distinct values. Rows equal in every column go to a footer, like the study's "fixed in every cell".
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from orchestrator.plan.runspec import RunSpec

MISSING = "–"


def cell_text(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _companions(params: dict[str, Any]) -> set[str]:
    """Numeric companions of written values (`rate_bit` next to `rate`): the table shows what was written."""
    return {k for k in params if "_" in k and k.rsplit("_", 1)[0] in params}


def arm_label(arms: list[str]) -> str:
    """`reno-ramp-aimd, reno-ramp-ls100` -> `reno-ramp-*`; unrelated names are listed."""
    if len(arms) == 1:
        return arms[0]
    parts = [a.split("-") for a in arms]
    common = []
    for segs in zip(*parts, strict=False):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return "-".join(common) + "-*" if common else ", ".join(arms)


def _values(runs: list[RunSpec], key: str) -> list[str]:
    out: list[str] = []
    for r in runs:
        text = cell_text(r.params[key] if key in r.params else r.derived.get(key))
        if text not in out:
            out.append(text)
    return out


def study_table(runs: list[RunSpec]) -> tuple[list[str], list[list[str]], list[tuple[str, str]]]:
    """(header, rows, fixed) for the runs of one plan; one column per experiment, or per matrix cell of an
    experiment that has several (`main.1`, `main.2` ...). Repetitions are collapsed."""
    columns: dict[tuple[str, int], list[RunSpec]] = defaultdict(list)
    for r in runs:
        if r.repetition == 0:
            columns[(r.experiment, r.cell)].append(r)
    cells_per_exp: dict[str, int] = defaultdict(int)
    for exp, _ in columns:
        cells_per_exp[exp] += 1
    header = [exp if cells_per_exp[exp] == 1 else f"{exp}.{cell + 1}" for exp, cell in columns]
    arms: list[Any] = []
    keys: list[str] = []
    for r in runs:
        skip = _companions(r.params) | {"arm"}
        keys += [k for k in (*r.params, *r.derived) if k not in skip and k not in keys]
        if r.params.get("arm") not in arms:
            arms.append(r.params.get("arm"))
    rows: list[list[str]] = []
    fixed: list[tuple[str, str]] = []
    for key in keys:
        per_arm = {a: tuple(" / ".join(_values([r for r in col if r.params.get("arm") == a], key)) or MISSING
                            for col in columns.values()) for a in arms}
        differs = any(len({per_arm[a][i] for a in arms if per_arm[a][i] != MISSING}) > 1
                      for i in range(len(columns)))
        if not differs:
            row = tuple(" / ".join(_values(col, key)) for col in columns.values())
            if len(set(row)) == 1:
                fixed.append((key, row[0]))
            else:
                rows.append([key, *row])
            continue
        groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for a, row in per_arm.items():
            groups[row].append(a)
        rows += [[f"{key} [{arm_label(members)}]", *row] for row, members in groups.items()]
    rows.append(["arms", *(str(len({r.params.get("arm") for r in col})) for col in columns.values())])
    rows.append(["runs", *(str(sum(1 for r in runs if (r.experiment, r.cell) == c)) for c in columns)])
    return ["parameter", *header], rows, fixed


def render(header: list[str], rows: list[list[str]], fixed: list[tuple[str, str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             .rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if fixed:
        lines.append("")
        lines.append("same in every run: " + ", ".join(f"{k}={v}" for k, v in fixed))
    return "\n".join(lines)
