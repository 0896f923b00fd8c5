"""Run ids are the key researchers' results hang on: a refactor must not move them. The fixture pins, per plan
in experiments/, the number of runs and the sha256 of its run ids in expansion order. A deliberate change to a
plan (or to what enters the run hash) updates the fixture in the same commit, with the reason in its message."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.plan import expand, load_plan
from tests.support.shipped import STUDY_PLANS

ROOT = Path(__file__).resolve().parents[2]
PINNED = json.loads((ROOT / "tests/fixtures/plans/run_ids.json").read_text())


def test_every_plan_is_pinned():
    plans = sorted(str(p.relative_to(ROOT)) for p in STUDY_PLANS)
    assert plans == sorted(PINNED)


@pytest.mark.parametrize("plan", sorted(PINNED))
def test_plan_expands_to_the_pinned_run_ids(plan):
    specs = expand(load_plan(ROOT / plan))
    digest = hashlib.sha256("\n".join(s.run_id for s in specs).encode()).hexdigest()
    assert (len(specs), digest) == (PINNED[plan]["runs"], PINNED[plan]["sha256_of_run_ids"])
