"""The campaign file: loading, the errors it gives (FILE:LINE:COL), cells paired across variants, cell keys that
only the cell changes, trial run ids and seeds, and the night's trial schedule (ABBA, retries, samples)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.campaign import cells, schedule
from orchestrator.campaign.loader import load_campaign, load_campaign_text
from orchestrator.plan import PlanError
from schemas.identifiers import RUN_ID_PATTERN

HERE = Path(__file__).resolve().parents[1] / "plans" / "campaign"
GOOD = (HERE / "tiny.yaml").read_text().replace("    cells: 1\n", "    cells: 2\n")


def _errors(text: str) -> list[str]:
    with pytest.raises(PlanError) as exc:
        load_campaign_text(text, "c.yaml", HERE)
    return [str(i) for i in exc.value.issues]


def test_tiny_campaign_pairs_every_cell_across_variants():
    lc = load_campaign_text(GOOD, str(HERE / "c.yaml"), HERE)
    assert [c.label for c in lc.cells] == ["tiny/main flows=1", "tiny/main flows=2"]
    assert [c.label for c in load_campaign(HERE / "tiny.yaml").cells] == ["tiny/main flows=1"]   # `cells: 1`
    for c in lc.cells:
        base, cand = c.specs["vanilla"], c.specs["long-queue"]
        assert base.run_id != cand.run_id
        assert cells.cell_key(base) == c.key and cells.cell_match(base) == cells.cell_match(cand)
        kernel_only = base.model_copy(update={"hosts": {r: h.model_copy(update={"kernel": None})
                                                        for r, h in base.hosts.items()}})
        assert cells.cell_key(kernel_only) == c.key        # a kernel is the variant, never the cell
        chain = {s.kind: s for s in cand.hosts["aqm"].qdiscs["client"]}
        assert chain["pfifo"].limit_packets == 1000 and {s.kind: s for s in base.hosts["aqm"].qdiscs["client"]}[
            "pfifo"].limit_packets == 100
        # the netns profile stands the running kernel in for the vanilla variant, and says so
        assert any("vanilla" in str(sub) for sub in base.substitutions)
        assert base.profile is not None and base.profile.name == "netns-lab"


def test_cell_key_ignores_comments_but_not_the_cell(tmp_path):
    plan = (HERE / "tiny-plan.yaml").read_text()
    (tmp_path / "tiny-plan.yaml").write_text("# an edited comment\n" + plan)
    a = load_campaign_text(GOOD, str(HERE / "c.yaml"), HERE)
    b = load_campaign_text(GOOD.replace("../../../experiments", str(HERE.parents[2] / "experiments")),
                           str(tmp_path / "c.yaml"), tmp_path)
    assert [c.key for c in a.cells] == [c.key for c in b.cells]
    (tmp_path / "tiny-plan.yaml").write_text(plan.replace("rate: 20mbit", "rate: 30mbit"))
    c = load_campaign_text(GOOD.replace("../../../experiments", str(HERE.parents[2] / "experiments")),
                           str(tmp_path / "c.yaml"), tmp_path)
    assert not {x.key for x in a.cells} & {x.key for x in c.cells}


def test_unknown_metric_is_located():
    errs = _errors(GOOD.replace("{metric: goodput}", "{metric: goodputt}"))
    assert len(errs) == 1 and errs[0].startswith("c.yaml:16:14:") and "checks[0].metric: unknown metric 'goodputt'" \
        in errs[0]


def test_baseline_must_be_vanilla():
    errs = _errors(GOOD.replace("{vanilla: true, package", "{vanilla: false, package"))
    assert any(e.startswith("c.yaml:10:") and "vanilla baseline is refused (G-BASELINE)" in e for e in errs)


def test_baseline_without_a_kernel_is_refused():
    text = GOOD.replace('    kernel: {vanilla: true, package: "linux-image-6.1.0-*-amd64"}\n', "    description: x\n")
    assert any("G-BASELINE" in e for e in _errors(text))


def test_override_of_no_field_and_direction_contradiction():
    text = GOOD.replace("bottleneck.queue.limit", "bottleneck.queue.limitt").replace(
        "{metric: goodput}", "{metric: goodput, better: lower}")
    errs = _errors(text)
    assert any(e.startswith("c.yaml:12:17: variants.long-queue.overrides['bottleneck.queue.limitt']: ") for e in errs)
    assert any("checks[0].better: goodput is better higher, declared once with the metric" in e for e in errs)


def test_override_of_a_field_the_plan_varies_is_refused():
    errs = _errors(GOOD.replace("bottleneck.queue.limit: 1000", "traffic.flows: 3"))
    assert any("varies traffic.flows itself" in e for e in errs)


def test_override_the_plan_refuses_is_reported_at_the_variant():
    errs = _errors(GOOD.replace("bottleneck.queue.limit: 1000", "bottleneck.queue.limit: -5"))
    assert any(e.startswith("c.yaml:11:3: variants.long-queue: plan tiny-plan.yaml with this variant: "
               "run.bottleneck.queue.limit:") for e in errs)


def test_missing_plan_and_bad_structure():
    errs = _errors(GOOD.replace("plan: tiny-plan.yaml", "plan: nowhere.yaml").replace("min: 4, max: 8",
                                                                                       "min: 9, max: 8"))
    assert any("repetitions" in e and "max (8) is below min (9)" in e for e in errs)
    errs = _errors(GOOD.replace("plan: tiny-plan.yaml", "plan: nowhere.yaml"))
    assert any(e.startswith("c.yaml:5:") and "nowhere.yaml" in e for e in errs)


def test_trial_run_ids_are_valid_and_distinct():
    key = "f" * 64
    ids = {cells.trial_run_id("nightly-netns-long-campaign-name-here", n, key, v, r, a)
           for n in (1, 999) for v in ("vanilla", "net-next+prr.fix") for r in range(3) for a in range(2)}
    assert len(ids) == 24 and all(re.fullmatch(RUN_ID_PATTERN, i) for i in ids)
    assert cells.trial_seed(1, key, 0) == cells.trial_seed(1, key, 0) != cells.trial_seed(1, key, 1)


def _rows(lc, existing=(), targets=None, attempts=2):
    targets = targets or {(c.key, v): 2 for c in lc.cells for v in lc.campaign.variants}
    seeds = {(c.key, r): r for c in lc.cells for r in range(10)}
    return schedule.new_trials("tiny-queue", 7, 3, lc.cells, list(lc.campaign.variants), targets, list(existing),
                               attempts, seeds, {0: "a" * 64})


def test_schedule_abba_and_retries():
    lc = load_campaign_text(GOOD, str(HERE / "c.yaml"), HERE)
    rows = _rows(lc)
    order = [(r["repetition"], r["cell_label"][-7:], r["variant"]) for r in rows]
    assert order[:4] == [(0, "flows=1", "vanilla"), (0, "flows=1", "long-queue"),
                         (0, "flows=2", "vanilla"), (0, "flows=2", "long-queue")]
    assert order[4:6] == [(1, "flows=1", "long-queue"), (1, "flows=1", "vanilla")]          # B A
    assert [r["seq"] for r in rows] == list(range(8))
    assert rows[0]["spec"]["run_id"] == rows[0]["run_id"] and rows[0]["spec"]["repetition"] == 0
    done = [{**r, "id": i, "status": "ok"} for i, r in enumerate(rows)]
    assert _rows(lc, done) == []
    done[0]["status"], done[1]["status"] = "failed", "refused"
    again = _rows(lc, done)
    assert [(r["run_id"], r["attempt"]) for r in again] == [(rows[0]["run_id"][:-1] + "1", 1)]
    assert again[0]["seq"] == 8
    assert _rows(lc, done, attempts=1) == []
    assert schedule.unfinished(done, 1) == sorted([(rows[0]["cell_key"], "vanilla", 0),
                                                    (rows[1]["cell_key"], "long-queue", 0)])


def test_samples_one_value_per_ok_repetition():
    t = [{"id": 1, "campaign_run_id": 7, "cell_key": "k", "variant": "v", "repetition": 0, "status": "ok"},
         {"id": 2, "campaign_run_id": 7, "cell_key": "k", "variant": "v", "repetition": 1, "status": "failed"},
         {"id": 3, "campaign_run_id": 7, "cell_key": "k", "variant": "v", "repetition": 1, "status": "ok"},
         {"id": 4, "campaign_run_id": 7, "cell_key": "k", "variant": "v", "repetition": 2, "status": "ok"}]
    vals = {1: {"goodput": 19.0}, 2: {"goodput": 1.0}, 3: {"goodput": 19.2}, 4: {"goodput": float("nan")}}
    assert schedule.samples(t, vals, "goodput") == {(7, "k", "v"): [19.0, 19.2]}


def test_campaign_schema_is_current_documents_every_field_and_accepts_the_shipped_campaigns():
    import json

    import yaml
    from jsonschema import Draft202012Validator

    from orchestrator.campaign.schema import CAMPAIGN_SCHEMA_PATH, campaign_schema
    from orchestrator.plan.model.schema import render

    assert CAMPAIGN_SCHEMA_PATH.read_text() == render(campaign_schema()), (
        "schemas/campaign.schema.json is stale: run `python -m orchestrator.campaign.schema`")
    schema = json.loads(CAMPAIGN_SCHEMA_PATH.read_text())
    props = [("Campaign." + k, v) for k, v in schema["properties"].items()]
    props += [(f"{m}.{k}", v) for m, sub in schema["$defs"].items() for k, v in sub.get("properties", {}).items()]
    assert [n for n, p in props if not (p.get("description") and p.get("examples"))] == []
    shipped = [*sorted((HERE.parents[2] / "experiments" / "campaigns").glob("*.yaml")),
               *sorted(p for p in HERE.glob("tiny*.yaml") if not p.name.endswith("-plan.yaml"))]
    assert len(shipped) >= 3
    for path in shipped:
        assert [e.message for e in Draft202012Validator(schema).iter_errors(yaml.safe_load(path.read_text()))] == []
        load_campaign(path)   # and the loader takes them, plans and all


def _history(lc, nights: int, step_from: int, factor: float, reps: int = 6, seed: int = 3):
    """Trials and metric values of `nights` nights: goodput ~19.1 Mbit/s (0.3 % noise) for both variants, the
    candidate's multiplied by `factor` from night `step_from` on."""
    import numpy as np

    from orchestrator.campaign.verdicts import History

    rng = np.random.default_rng(seed)
    cell = lc.cells[0].key
    trials, values, tid = [], {}, 0
    for night in range(1, nights + 1):
        for variant in ("vanilla", "long-queue"):
            for rep in range(reps):
                tid += 1
                scale = factor if variant == "long-queue" and night >= step_from else 1.0
                trials.append({"id": tid, "campaign_run_id": night, "cell_key": cell, "variant": variant,
                               "repetition": rep, "status": "ok"})
                values[tid] = {"goodput": 19.1 * scale * (1 + 0.003 * rng.standard_normal()),
                               "qdelay_median": 50.0 * (1 + 0.01 * rng.standard_normal())}
    return History(trials, values, list(range(1, nights + 1)), nights)


def test_verdicts_relative_and_a_sustained_step_found_by_the_trend():
    from orchestrator.campaign.verdicts import EXIT_PASS, EXIT_REGRESSION, exit_code, judge

    text = GOOD.replace("  - {metric: goodput}\n", "  - {metric: goodput}\n  - {metric: goodput, kind: trend, "
                        "min_effect: 0.03}\n")
    lc = load_campaign_text(text, str(HERE / "c.yaml"), HERE)
    lc = type(lc)(lc.campaign, lc.path, lc.sha256, lc.text, lc.plans, lc.cells[:1])
    rows = {(r.metric, r.kind): r for r in judge(lc.campaign, lc.cells, _history(lc, 10, 8, 0.95))}
    rel, tr = rows[("goodput", "relative")], rows[("goodput", "trend")]
    assert rel.verdict == "REGRESSION" and 0.94 < rel.detail["ratio"] < 0.96 and rel.detail["p_adjusted"] < 0.05
    assert rows[("qdelay_median", "relative")].verdict == "PASS"
    assert tr.verdict == "REGRESSION" and tr.detail["change_points"] == [8] and tr.detail["last_good_night_id"] == 7
    assert exit_code(list(rows.values()), 0, strict=False) == EXIT_REGRESSION
    flat = {(r.metric, r.kind): r for r in judge(lc.campaign, lc.cells, _history(lc, 10, 99, 1.0))}
    assert {r.verdict for r in flat.values()} == {"PASS"} and exit_code(list(flat.values()), 0, False) == EXIT_PASS
    assert exit_code(list(flat.values()), 1, False) == 2           # a slot that never succeeded


def test_a_metric_the_cell_does_not_define_is_not_applicable_not_missing():
    from orchestrator.campaign.verdicts import History, exit_code, judge

    lc = load_campaign_text(GOOD.replace("{metric: goodput}", "{metric: jain}"), str(HERE / "c.yaml"), HERE)
    cell = lc.cells[0].key
    trials = [{"id": i, "campaign_run_id": 1, "cell_key": cell, "variant": v, "repetition": i % 4, "status": "ok"}
              for i, v in enumerate(["vanilla"] * 4 + ["long-queue"] * 4)]
    values = {i: {"jain": float("nan"), "qdelay_median": 50.0 + i % 4} for i in range(8)}
    rows = {r.metric: r for r in judge(lc.campaign, lc.cells[:1], History(trials, values, [1], 1))}
    assert rows["jain"].verdict == "N/A" and rows["qdelay_median"].verdict != "NO DATA"
    assert exit_code(list(rows.values()), 0, False) != 2
    lost = judge(lc.campaign, lc.cells[:1], History(trials[:5], values, [1], 1))   # one candidate trial only
    assert {r.verdict for r in lost} == {"NO DATA"} and exit_code(lost, 0, False) == 2
