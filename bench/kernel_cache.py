"""Benchmark: a kernel build's cache hit vs the build it saves, and whether two builds of one key agree.

Usage: .venv/bin/python bench/kernel_cache.py PLAN VARIANT [--rebuild]
Times `builder.build` on a cached variant (pinning the inputs: apt, file hashes, toolchain versions; no make)
against the build's own recorded duration, and prints the ratio. With --rebuild it builds the same key again
into a temporary cache and compares every output's sha256 with the cached build's (reproducibility): that takes
as long as the first build (~15 min for tinyconfig on 2 cores).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from orchestrator.kernel import builder
from orchestrator.plan import load_plan


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit(__doc__)
    plan_path, name = Path(argv[0]), argv[1]
    variant = load_plan(plan_path).kernels[name]
    first = builder.build(name, variant, plan_path.parent)
    t = time.perf_counter()
    hit = builder.build(name, variant, plan_path.parent)
    hit_s = time.perf_counter() - t
    built_s = float(first.entry.metadata["duration_s"])
    print(f"kernel cache: hit {hit_s:.3f} s (cached: {hit.hit}), the build it saves {built_s:.0f} s, "
          f"ratio {built_s / hit_s:,.0f}x; release {hit.entry.release}")
    if "--rebuild" in argv:
        with tempfile.TemporaryDirectory(dir=first.entry.path.parent) as tmp:
            again = builder.build(name, variant, plan_path.parent, Path(tmp))
            a = {o["name"]: o["sha256"] for o in first.entry.metadata["outputs"]}
            b = {o["name"]: o["sha256"] for o in again.entry.metadata["outputs"]}
            same = sorted(n for n in a if a[n] == b.get(n))
            differ = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
            print(f"rebuild in {again.entry.metadata['duration_s']} s: {len(same)} outputs identical, "
                  f"{len(differ)} differ{': ' + ', '.join(differ) if differ else ''}")


if __name__ == "__main__":
    main(sys.argv[1:])
