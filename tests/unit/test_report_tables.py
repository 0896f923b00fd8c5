"""Study tables in the studies' shapes (analysis/tables.py) from stand-in run analyses with literal numbers."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from analysis.metrics import Stats
from analysis.runmeta import RunMeta
from analysis.tables import arm_labels, qdelay_tables, utilisation_table
from orchestrator.plan import HostSpec, LinkRef, RunSpec
from schemas.hoststate import Htb, Pfifo


def run(run_id, exp, arm, queue_mode, mean, rep=0, util=0.9):
    params = {"arm": arm, "queue": {"kind": "red", "mode": queue_mode}, "rate": "200mbit", "rate_bit": 200_000_000}
    meta = RunMeta(run_id=run_id, status="complete", params=params, t0_ns=None, duration_s=1.0, plan_name="lsaimd-t51",
                   experiment=exp, repetition=rep)
    q = Stats(100, mean - 10, mean, mean, 5.0, mean + 20, mean + 30, mean + 40)
    return NS(run_id=run_id, data_meta=meta, qdelay=q, row=NS(cc="reno"), flows=[],
              utilisation=NS(wire=NS(mean=util)))


def test_lsaimd_table_one_per_aqm_stats_by_arm_and_experiment_mean_over_repetitions():
    runs = [run("a", "1", "reno-ramp-aimd", "ramp", 500), run("b", "1", "reno-ramp-aimd", "ramp", 700, rep=1),
            run("c", "2", "reno-ramp-aimd", "ramp", 900), run("d", "1", "reno-ramp-ls100", "ramp", 300),
            run("e", "1", "dctcp-step-aimd", "step", 250)]
    tables = {t.name: t for t in qdelay_tables(runs)}
    assert set(tables) == {"qdelay_red_ramp", "qdelay_red_step"}
    ramp = tables["qdelay_red_ramp"]
    assert ramp.columns == ("stat", "arm", "1", "2")
    cell = {(r[0], r[1]): r[2:] for r in ramp.rows}
    assert [r[0] for r in ramp.rows[::2]] == ["min", "max", "mean", "sd", "p95", "p99"]   # the study's order
    assert cell[("mean", "reno-ramp-aimd")] == pytest.approx((600.0, 900.0))   # mean of reps 500, 700
    assert cell[("max", "reno-ramp-aimd")] == pytest.approx((640.0, 940.0))
    assert cell[("mean", "reno-ramp-ls100")] == (300.0, None)                   # arm not run in exp 2: –
    assert "1/2 repetition" in ramp.note


def test_arm_labels_fall_back_to_varied_params_and_aqm_to_the_chain_leaf():
    a, b = run("a", "main", None, "ramp", 1), run("b", "main", None, "ramp", 1)
    a.data_meta.params.update(arm=None, cc="reno", rate="20mbit", rate_bit=20_000_000)
    b.data_meta.params.update(arm=None, cc="cubic", rate="20mbit", rate_bit=20_000_000)
    assert arm_labels([a, b]) == {"a": "cc=reno", "b": "cc=cubic"}
    spec = RunSpec(run_id="r", plan_name="p", experiment="main", params={}, duration_s=1.0, flows=[], captures=[],
                   hosts={"aqm": HostSpec(qdiscs={"client": [Htb(rate_bit=10**7), Pfifo(limit_packets=100)]})},
                   qdisc_stats=[LinkRef(host="aqm", toward="client")])

    def meta(params: dict, spec: RunSpec | None) -> RunMeta:
        return RunMeta(run_id="r", status="complete", params=params, t0_ns=None, duration_s=1.0, spec=spec)
    assert meta({}, spec).aqm == "pfifo" and meta({"aqm": "fq_codel"}, None).aqm == "fq_codel"
    assert meta({}, None).aqm == "–"


def test_utilisation_table_per_experiment_and_arm():
    runs = [run("a", "1", "x", "ramp", 1, util=0.9), run("b", "1", "x", "ramp", 1, util=0.7)]
    (row,) = utilisation_table(runs).rows
    assert row[:4] == ("1", "red-ramp", "x", 2)
    assert row[4:] == pytest.approx((80.0, 80.0, 10.0, 70.0, 90.0))   # mean, median, sd, min, max (%)
