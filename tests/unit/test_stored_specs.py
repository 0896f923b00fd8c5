"""RunSpecs are stored (the run table's `spec` and `derived` columns, every run folder's ingest.json) and read
back by `tcplab ingest` and the analysis. The fixture holds specs as the expansion wrote them before `derived`
became a typed model: one run for every combination of derived values the plans in experiments/ produce
(no bottleneck, FIFO, RED ramp and step, the `mark` step, netem sizing ...)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.plan import RunSpec, expand, load_plan

ROOT = Path(__file__).resolve().parents[2]
STORED = json.loads((ROOT / "tests/fixtures/plans/stored_specs.json").read_text())


@pytest.mark.parametrize("stored", STORED, ids=[s["spec"]["run_id"] for s in STORED])
def test_a_stored_spec_reads_back_and_writes_out_byte_for_byte(stored):
    spec = RunSpec.model_validate(stored["spec"])
    assert json.dumps(spec.model_dump(mode="json")) == json.dumps(stored["spec"])   # key order included
    assert json.dumps(spec.derived.model_dump(mode="json")) == json.dumps(stored["spec"]["derived"])


@pytest.mark.parametrize("stored", STORED, ids=[s["spec"]["run_id"] for s in STORED])
def test_the_plan_still_expands_to_the_stored_spec(stored):
    [spec] = [s for s in expand(load_plan(ROOT / stored["plan"])) if s.run_id == stored["spec"]["run_id"]]
    assert json.dumps(spec.model_dump(mode="json")) == json.dumps(stored["spec"])


def test_derived_values_are_typed_and_unset_ones_stay_out_of_the_json():
    [quick] = [s["spec"] for s in STORED if s["plan"] == "experiments/quickstart.yaml"]
    spec = RunSpec.model_validate(quick)
    assert spec.derived.bottleneck_rate_bit == 20_000_000 and spec.derived.bdp_bytes is None
    assert "bdp_bytes" not in spec.derived.model_dump() and "bdp_bytes" not in spec.model_dump(mode="json")["derived"]
    with pytest.raises(ValueError, match="bdp_byte"):
        RunSpec.model_validate({**quick, "derived": {**quick["derived"], "bdp_byte": 1}})   # a typo is refused
