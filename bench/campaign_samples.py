"""Extract the per-repetition samples the campaign statistics' benchmark resamples (bench/campaign_stats.py).

Usage: .venv/bin/python bench/campaign_samples.py DB_URL OUT_CSV [--note TEXT]

Every complete run of the DB is analysed with the report's own analysis (analysis.load.iter_runs +
analysis.runstats.analyse) and written as one CSV row: run id, flows, repetition, the run flags, and each
metric of analysis.compare.METRICS in its display unit. Lines starting with '#' carry the provenance
(--note, the plan name, when). tests/fixtures/campaign/netns_reps.csv was made with it.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def main(argv: list[str] | None = None) -> int:
    from analysis.compare import METRICS
    from analysis.load import iter_runs
    from analysis.runstats import analyse
    from orchestrator.storage.db import open_db

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("out", type=Path)
    ap.add_argument("--note", action="append", default=[])
    args = ap.parse_args(argv)
    rows = []
    plans = set()
    for data in iter_runs(open_db(args.db), detail=True):
        r = analyse(data)
        meta = data.meta
        plans.add(meta.plan_name)
        rows.append([meta.run_id, meta.params.get("flows", len(data.flows)), meta.repetition,
                     " ".join(meta.flags) or "-"]
                    + [f"{m.value(r) * m.scale:.6g}" for m in METRICS])
    rows.sort(key=lambda row: (row[1], row[2]))
    with args.out.open("w", newline="") as f:
        for line in args.note:
            f.write(f"# {line}\n")
        f.write(f"# extracted {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC from plan(s) {', '.join(sorted(plans))} "
                f"by bench/campaign_samples.py; metric units: "
                + "; ".join(f"{m.name} [{m.unit or '-'}]" for m in METRICS) + "\n")
        w = csv.writer(f)
        w.writerow(["run_id", "flows", "repetition", "flags"] + [m.name for m in METRICS])
        w.writerows(rows)
    print(f"{len(rows)} runs -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
