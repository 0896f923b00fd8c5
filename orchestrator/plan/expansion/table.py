"""`tcplab plan table`: the study-style parameter table of a plan (pure).

Rows are parameters (the values the plan varies, then derived ones), columns are experiments, as in the
studies' own tables (LS-AIMD Table 5.1: columns 1, 2, 3A ... 4H). A value that differs between the arms
of an experiment gets one row per group of arms that share it, labelled with the arms' common name prefix
(`red_min_bytes [dctcp-step-*]`); a value that varies inside one arm (a matrix within the experiment)
lists its distinct values. Rows equal in every column go to a footer, like the study's "fixed in every cell".
"""
from __future__ import annotations

import fnmatch
import json
import os
from collections import defaultdict
from typing import Any

from orchestrator.plan.expansion.runspec import RunSpec

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


def _pieces(name: str) -> set[str]:
    """Substrings of an arm name that start at a token boundary (`-ls`, `-ramp-`), for readable globs."""
    starts = [i for i, c in enumerate(name) if c == "-"]
    return {name[i:j] for i in starts for j in range(i + 3, len(name) + 1)}


def arm_label(members: list[str], every: list[str]) -> str:
    """A readable glob that names exactly these arms among all (`reno-ramp-*`, `*-ls100*`, `dctcp-*-ls*`),
    else the list."""
    if None in members:   # runs of an experiment without arms
        rest = [m for m in members if m is not None]
        return ", ".join(["no arm"] + ([arm_label(rest, every)] if rest else []))
    if len(members) == 1:
        return members[0]
    tokens = [m.split("-") for m in members]
    prefix = "-".join(os.path.commonprefix(tokens))
    suffix = "-".join(os.path.commonprefix([tk[::-1] for tk in tokens])[::-1])
    heads = [prefix + "-"] if prefix else [""]
    middles = set.intersection(*(_pieces(m) for m in members))
    candidates = [h + "*" for h in heads if h] + (["*-" + suffix] if suffix else [])
    rest = os.path.commonprefix([m[len(heads[0]):] for m in members])
    candidates += [heads[0] + rest + "*"] if rest else []
    candidates += [h + "*" + mid + "*" for h in heads for mid in middles]
    candidates += [h + "*" + mid for h in heads for mid in middles if all(m.endswith(mid) for m in members)]
    exact = [g for g in candidates if
             sorted(a for a in every if a is not None and fnmatch.fnmatchcase(a, g)) == sorted(members)]
    # the most literal text explains the group best
    return max(exact, key=lambda g: (len(g.replace("*", "")), -len(g))) if exact else ", ".join(members)


def merge_arms(per_arm: dict[Any, tuple[str | None, ...]]) -> list[tuple[tuple[str | None, ...], list[Any]]]:
    """Arms whose rows agree wherever both ran share one row (None: the arm did not run in that column)."""
    groups: list[tuple[list[str | None], list[Any]]] = []
    for arm, row in per_arm.items():
        for merged, members in groups:
            if all(a == b or None in (a, b) for a, b in zip(merged, row, strict=True)):
                merged[:] = [b if a is None else a for a, b in zip(merged, row, strict=True)]
                members.append(arm)
                break
        else:
            groups.append((list(row), [arm]))
    return [(tuple(row), members) for row, members in groups]


def _flat(key: str, value: Any) -> list[tuple[str, Any]]:
    """A model-valued parameter (a queue) becomes one row per field: `queue.mode`, `queue.min` ..."""
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flat(f"{key}.{k}", v)]
    return [(key, value)]


def flat_params(r: RunSpec) -> dict[str, Any]:
    skip = _companions(r.params) | {"arm"}
    return dict(kv for k, v in r.params.items() if k not in skip for kv in _flat(k, v))


def _values(runs: list[RunSpec], key: str, shown: dict[str, dict[str, Any]]) -> list[str]:
    """Distinct texts of `key` over `runs`; `shown[run_id]` is the run's flattened params over its derived."""
    out: list[str] = []
    for r in runs:
        text = cell_text(shown[r.run_id].get(key))
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
    # flatten each run once: a params value wins over a derived one of the same name
    shown = {r.run_id: {**r.derived.model_dump(), **flat_params(r)} for r in runs if r.repetition == 0}
    for r in runs:
        keys += [k for k in (*flat_params(r), *r.derived.model_dump()) if k not in keys]
        if r.params.get("arm") not in arms:
            arms.append(r.params.get("arm"))
    rows: list[list[str]] = []
    fixed: list[tuple[str, str]] = []
    for key in keys:
        # None: the arm did not run in that column (it may share a row with any arm there)
        per_arm = {a: tuple(" / ".join(_values([r for r in col if r.params.get("arm") == a], key, shown)) or None
                            for col in columns.values()) for a in arms}
        differs = any(len({per_arm[a][i] for a in arms} - {None}) > 1 for i in range(len(columns)))
        if not differs:
            row = tuple(" / ".join(_values(col, key, shown)) for col in columns.values())
            if len(set(row)) == 1:
                fixed.append((key, row[0]))
            else:
                rows.append([key, *row])
            continue
        rows += [[f"{key} [{arm_label(members, arms)}]", *(v or MISSING for v in row)]
                 for row, members in merge_arms(per_arm) if set(row) - {None, MISSING}]
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
