"""The study file (docs/studies.md): the shipped studies load and select what they say, errors name
FILE:LINE:COL and the field, comparisons a profile erases are found from the runs themselves, and the cells'
aggregates and verdicts (tolerance, not measured, not reproducible, a profile's stretched times undone)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.plan import PlanError, expand, load_plan
from orchestrator.plan.checks.profile_loader import load_profile
from orchestrator.study import cells
from orchestrator.study.loader import load_study, load_study_text, study_path
from orchestrator.study.model import Comparison, Table

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments"
LSAIMD = (EXP / "lsaimd" / "study.yaml").read_text()


def _errors(text: str) -> list[str]:
    with pytest.raises(PlanError) as exc:
        load_study_text(text, "s.yaml", EXP / "lsaimd")
    return [str(i) for i in exc.value.issues]


def test_the_shipped_studies_load_and_select_their_cells():
    ls = load_study(study_path("lsaimd"))
    runs = ls.plans["table-5-1.yaml"].runs
    assert len(runs) == 24 and {r.repetition for r in runs} == {0}
    assert {r.params["arm"] for r in runs} == {"reno-ramp-aimd", "dctcp-step-aimd"}
    assert ls.profile.name == "uml-lab"
    assert [t.id for t in ls.study.tables] == ["table-9.1", "table-9.2"]
    thin = load_study(study_path("thin-stream"))
    assert [r.experiment for r in thin.plans["thin-stream.yaml"].runs] == ["thin-f5", "thin-f5"]


def test_a_study_is_found_by_name_or_said_missing_with_the_names_there_are():
    assert study_path("lsaimd") == EXP / "lsaimd" / "study.yaml"
    with pytest.raises(FileNotFoundError) as exc:
        study_path("lsaimdd")
    assert "no study 'lsaimdd'" in str(exc.value) and "lsaimd" in str(exc.value).split("studies under")[1]


def test_errors_name_the_file_line_column_and_field():
    assert _errors(LSAIMD.replace("metric: qdelay_mean\n", "metric: qdelay_average\n", 1))[0].startswith(
        "s.yaml:26:13: tables[0].metric: unknown metric 'qdelay_average'; known: ce_fraction, ")
    assert _errors(LSAIMD.replace("[472, 480, 748,", "[480, 748,")) == [
        "s.yaml:51:16: tables[1].rows[0].paper: 11 values for 12 columns"]
    second = LSAIMD.index("  - id: table-9.2")
    assert _errors(LSAIMD[:second] + LSAIMD[second:].replace("plan: table-5-1.yaml", "plan: table-5-2.yaml")) == [
        "s.yaml:42:11: tables[1].plan: 'table-5-2.yaml' is not one of `plans:` (table-5-1.yaml)"]
    assert _errors(LSAIMD.replace('"4G", "4H"]\n    arms', '"4G", "4J"]\n    arms')) == [
        "s.yaml:18:83: plans[0].experiments[11]: the plan has no experiment '4J'"]
    assert _errors(LSAIMD.replace("    repetitions: 1\n", "    repetitions: 9\n")) == [
        "s.yaml:20:18: plans[0].repetitions: the plan has 5 repetitions"]
    assert _errors(LSAIMD.replace("title: \"LS-AIMD", "titel: \"LS-AIMD"))[0].startswith("s.yaml:")


def _thin_runs(profile: str | None):
    plan = load_plan(EXP / "thin-stream" / "thin-stream.yaml")
    prof = load_profile(EXP / "profiles" / profile) if profile else None
    return [s for s in expand(plan, profile=prof) if s.experiment == "thin-f5"]


COMPARE = Comparison(name="3.15 vs 3.18", plan="thin-stream.yaml", arms=["linux-3.15", "linux-3.18"])


def test_a_comparison_the_profile_erases_is_found_from_the_runs():
    (erased,) = cells.erased_comparisons([COMPARE], _thin_runs("vm-lab.yaml"))   # Debian 6.1 for both
    assert erased.arms == ("linux-3.15", "linux-3.18")
    assert "the profile gives linux-3.15 and linux-3.18 the same kernel" in erased.why
    assert cells.erased_comparisons([COMPARE], _thin_runs(None)) == []      # as planned: two kernels
    # the UML lab keeps the difference: 3.15's cwnd-limited test restored on its kernel against the stock one
    assert cells.erased_comparisons([COMPARE], _thin_runs("uml-lab.yaml")) == []


def test_aggregates_and_verdicts():
    assert cells.aggregate([1.0, 3.0, math.nan], "mean") == 2.0
    assert cells.aggregate([1.0, 3.0], "sd") == pytest.approx(math.sqrt(2))
    assert math.isnan(cells.aggregate([1.0], "sd")) and cells.aggregate([math.nan], "n") == 0
    tol = Table.model_fields["tolerance"].annotation(abs=32.768, rel=0.2)
    assert cells.verdict(600.0, 555, tol) == cells.WITHIN          # 45 <= max(32.8, 111)
    assert cells.verdict(700.0, 555, tol) == cells.OUT
    assert cells.verdict(math.nan, 555, tol) == cells.NOT_MEASURED
    assert cells.verdict(1.0, None, tol) == cells.NO_PAPER


def test_cells_undo_the_profiles_stretched_times_and_name_what_is_missing():
    ls = load_study(study_path("lsaimd"))
    table = ls.study.tables[0]
    runs = ls.plans["table-5-1.yaml"].runs
    one = next(r for r in runs if r.experiment == "1" and r.params["arm"] == "reno-ramp-aimd")
    three = next(r for r in runs if r.experiment == "3A" and r.params["arm"] == "reno-ramp-aimd")
    assert cells.time_stretch(one) == cells.time_stretch(three) == 2.0   # 200 Mbit/s run at 100, times x2
    assert cells.time_stretch(expand(load_plan(EXP / "lsaimd" / "table-5-1.yaml"))[0]) == 1.0   # no profile
    values = {one.run_id: {"qdelay_mean": 1.2, "qdelay_p99": math.nan}, three.run_id: {"qdelay_mean": 2.2}}
    refused = {r.run_id: "host sender lacks congestion control lsaimd" for r in runs if r.experiment == "4H"}
    got = {(c.row, c.column): c for c in cells.table_cells(table, runs, values, refused, [],
                                                            frozenset({"qdelay_mean", "qdelay_p99"}))}
    assert (got["Reno AIMD, mean", "1"].measured, got["Reno AIMD, mean", "1"].verdict) == (600.0, cells.WITHIN)
    assert (got["Reno AIMD, mean", "3A"].measured, got["Reno AIMD, mean", "3A"].verdict) == (1100.0, cells.WITHIN)
    assert got["Reno AIMD, p99", "1"].verdict == cells.NOT_MEASURED
    assert got["Reno AIMD, p99", "1"].why == "qdelay_p99 has no value in its runs"
    assert got["Reno AIMD, mean", "2"].verdict == cells.NOT_MEASURED
    assert got["Reno AIMD, mean", "4H"].verdict == cells.NOT_REPRODUCIBLE
    assert got["Reno AIMD, mean", "4H"].why == "host sender lacks congestion control lsaimd"
    erased = [cells.Erased("x", ("reno-ramp-aimd", "other"), "same kernel")]
    assert {c.verdict for c in cells.table_cells(table, runs, values, {}, erased)} == {cells.NOT_REPRODUCIBLE}


def test_the_study_schema_is_current_documents_every_field_and_accepts_the_shipped_studies():
    import json

    import yaml
    from jsonschema import Draft202012Validator

    from orchestrator.plan.model.schema import render
    from orchestrator.study.loader import study_files
    from orchestrator.study.schema import STUDY_SCHEMA_PATH, study_schema

    assert STUDY_SCHEMA_PATH.read_text() == render(study_schema()), (
        "schemas/study.schema.json is stale: run `python -m orchestrator.study.schema`")
    schema = json.loads(STUDY_SCHEMA_PATH.read_text())
    props = [("Study." + k, v) for k, v in schema["properties"].items()]
    props += [(f"{m}.{k}", v) for m, sub in schema["$defs"].items() for k, v in sub.get("properties", {}).items()]
    assert [n for n, p in props if not (p.get("description") and p.get("examples"))] == []
    shipped = study_files()
    assert len(shipped) >= 2
    for path in shipped:
        assert [e.message for e in Draft202012Validator(schema).iter_errors(yaml.safe_load(path.read_text()))] == []


def test_tcplab_run_finds_the_arms_a_profile_makes_identical_without_a_declared_comparison():
    from orchestrator.engine.arm_identity import erased_by_profile

    plan = load_plan(EXP / "thin-stream" / "thin-stream.yaml")
    planned = expand(plan)
    (erased,) = erased_by_profile(planned, expand(plan, profile=load_profile(EXP / "profiles" / "vm-lab.yaml")))
    assert erased.arms == ("linux-3.15", "linux-3.18")
    assert erased_by_profile(planned, planned) == []
    lsaimd = load_plan(EXP / "lsaimd" / "table-5-1.yaml")     # its arms differ in CC, queue and kernel patches
    assert erased_by_profile(expand(lsaimd), expand(lsaimd, profile=load_profile(
        EXP / "profiles" / "uml-lab.yaml"))) == []


def test_the_project_modules_the_study_plans_name_are_where_they_say():
    """A variant's `modules:` path is relative to its plan; the project's own modules live in
    experiments/modules/ (the studies' modules that are not in this repository are named, not shipped)."""
    from tests.support.shipped import STUDY_PLANS

    project = {p.name for p in (EXP / "modules").iterdir() if p.is_dir()}
    named = []
    for path in STUDY_PLANS:
        plan = load_plan(path)
        for variant in plan.kernels.values():
            for m in variant.modules:
                if Path(m).name in project:
                    named.append((path.name, m))
                    assert (path.parent / m).resolve() == (EXP / "modules" / Path(m).name).resolve(), (path, m)
    assert len(named) >= 10
