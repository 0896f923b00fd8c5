"""Expansion: quickstart gives its 8 runs with typed params; ids are stable; matrix features behave."""
from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.plan import RunSpec, expand, load_plan, load_plan_text, plan_sha256
from orchestrator.plan.commands import cmd_expand, cmd_table, cmd_validate
from orchestrator.plan.expansion.derive import bdp_bytes, window_segments
from orchestrator.plan.model.frames import htb_burst_bytes
from schemas.hoststate import Bfifo, Htb, Pfifo, Tbf

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
STUDY = ROOT / "tests" / "plans" / "good_study.yaml"
RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@pytest.fixture(scope="module")
def quick() -> list[RunSpec]:
    return expand(load_plan(QUICKSTART))


def test_quickstart_expands_to_eight_runs(quick: list[RunSpec]) -> None:
    assert len(quick) == 8
    combos = {(r.params["cc"], r.params["rate"], r.params["flows"]) for r in quick}
    assert combos == {(cc, rate, n) for cc in ("reno", "cubic") for rate in ("20mbit", "50mbit") for n in (1, 2)}
    for r in quick:
        assert set(r.params) == {"cc", "rate", "rate_bit", "flows"}
        assert r.params["rate_bit"] == {"20mbit": 20_000_000, "50mbit": 50_000_000}[r.params["rate"]]
        assert r.duration_s == 5.0 and r.plan_name == "quickstart" and r.experiment == "main"
        assert RUN_ID.match(r.run_id) and r.run_id.startswith("quickstart-main-") and r.run_id.endswith("-r0")
    assert len({r.run_id for r in quick}) == 8


def test_quickstart_order_is_the_matrix_order(quick: list[RunSpec]) -> None:
    # first axis (cc) slowest, last axis (flows) fastest
    assert [(r.params["cc"], r.params["rate"], r.params["flows"]) for r in quick[:3]] == [
        ("reno", "20mbit", 1), ("reno", "20mbit", 2), ("reno", "50mbit", 1)]


def test_quickstart_hosts(quick: list[RunSpec]) -> None:
    for r in quick:
        assert set(r.hosts) == {"client", "aqm", "server"}
        for host in r.hosts.values():
            assert host.offloads == {"tso": False, "gso": False, "gro": False, "sg": False}
            assert host.sysctls["net.ipv4.tcp_ecn"] == "0"
            assert host.sysctls["net.ipv4.tcp_rmem"] == "4096 131072 8388608"
            assert not any(k.startswith("net.core.") for k in host.sysctls)
            assert host.flush_tcp_metrics
        assert r.hosts["client"].qdiscs == {} and r.hosts["server"].qdiscs == {}
        htb, leaf = r.hosts["aqm"].qdiscs["client"]
        rate = r.params["rate_bit"]
        assert isinstance(htb, Htb) and htb.rate_bit == rate and htb.ceil_bit == rate
        assert htb.burst_bytes == htb.cburst_bytes == max(rate // 8000, 1514)
        assert leaf == Pfifo(limit_packets=100)
        assert r.derived.htb_burst_bytes == htb.burst_bytes


def test_quickstart_flows_captures_stats(quick: list[RunSpec]) -> None:
    for r in quick:
        assert len(r.flows) == r.params["flows"]
        assert [f.port for f in r.flows] == [5201 + i for i in range(len(r.flows))]
        for f in r.flows:
            assert (f.src, f.dst, f.cc, f.tool) == ("server", "client", r.params["cc"], "iperf3")
            assert f.start_s == 0 and f.duration_s == 5.0
        assert [c.link.label for c in r.captures] == ["aqm:to-client", "aqm:to-server"]
        assert [ln.label for ln in r.qdisc_stats] == ["aqm:to-client"] and r.qdisc_stats_interval_ms == 10
        assert r.senders == ["server"]


def test_run_ids_stable_across_loads_and_spellings(tmp_path: Path) -> None:
    first = [r.run_id for r in expand(load_plan(QUICKSTART))]
    assert first == [r.run_id for r in expand(load_plan(QUICKSTART))]
    # respelling a value (same kernel value) and reformatting the file keeps every id
    text = QUICKSTART.read_text().replace("[20mbit, 50mbit]", "[20Mbit, 50 mbit]").replace("# ", "#  ")
    assert [r.run_id for r in expand(load_plan_text(text))] == first
    # changing the template changes every id
    changed = QUICKSTART.read_text().replace("duration: 5s", "duration: 6s")
    assert not set(first) & {r.run_id for r in expand(load_plan_text(changed))}


def test_plan_sha256(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(QUICKSTART.read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", plan_sha256(p)) and plan_sha256(p) == plan_sha256(QUICKSTART)


def test_study_plan_cells_arms_zip_include_exclude() -> None:
    plan = load_plan(STUDY)
    runs = expand(plan, order="cells")
    cells = Counter((r.experiment, r.params.get("arm"), r.params.get("rate")) for r in runs)
    # every run carries every varied field: experiments 1 and 2 show the template's rate
    assert cells == Counter({("1", "reno", "200mbit"): 2, ("1", "cubic", "200mbit"): 2, ("2", "reno", "200mbit"): 2,
                             ("3A", "reno", "200mbit"): 2, ("3A", "reno", "1gbit"): 2,
                             ("3A", "cubic", "200mbit"): 2, ("3A", "cubic", "1gbit"): 2})
    zipped = next(r for r in runs if r.experiment == "3A" and r.params.get("rate") == "200mbit")
    assert zipped.params["queue"] == {"kind": "pfifo", "limit": 50}   # zipped with the 200mbit rate
    assert zipped.hosts["aqm"].qdiscs["client"][1] == Pfifo(limit_packets=50)
    included = next(r for r in runs if r.params.get("rate") == "1gbit")
    assert included.params["ecn"] == 0 and included.hosts["client"].sysctls["net.ipv4.tcp_ecn"] == "0"
    assert included.hosts["aqm"].qdiscs["client"][1] == Bfifo(limit_bytes=65536)   # template queue
    assert all(r.params["flows"] == 8 and r.params["base_rtt_s"] == pytest.approx(1e-4)
               for r in runs if r.experiment == "3A")


def test_study_plan_flows_and_hosts() -> None:
    runs = expand(load_plan(STUDY), order="cells")
    two = next(r for r in runs if r.experiment == "2")
    f0, f1 = two.flows
    assert (f0.cc, f0.start_s, f0.duration_s, f0.port) == ("reno", 0.0, 20.0, 5201)
    assert (f1.cc, f1.start_s, f1.duration_s, f1.port) == ("bbr", 5.0, 15.0, 5202)
    eight = next(r for r in runs if r.experiment == "3A")
    assert [f.start_s for f in eight.flows] == [float(i) for i in range(8)]     # stagger 1s
    one = next(r for r in runs if r.experiment == "1")
    assert one.flows[0].duration_s == 10.0 and one.duration_s == 20.0
    assert one.hosts["server"].qdiscs["aqm"] == [Tbf(rate_bit=10**9, burst_bytes=32768, limit_bytes=150_000)]
    assert one.captures[0].snaplen == 96


def test_repetitions_seeds_and_random_order() -> None:
    plan = load_plan(STUDY)
    runs = expand(plan)
    assert len(runs) == 14 and len({r.run_id for r in runs}) == 14
    assert len({r.seed for r in runs}) == 14
    assert [r.repetition for r in runs] == [0] * 7 + [1] * 7            # rounds, each shuffled
    assert [r.run_id for r in runs] == [r.run_id for r in expand(load_plan(STUDY))]   # deterministic
    by_cells = expand(plan, order="cells")
    assert sorted(r.run_id for r in runs) == sorted(r.run_id for r in by_cells)
    assert [r.run_id for r in runs[:7]] != [r.run_id for r in by_cells if r.repetition == 0]
    reseeded = load_plan_text(STUDY.read_text().replace("seed: 7", "seed: 8"))
    assert {r.run_id for r in expand(reseeded)} == {r.run_id for r in runs}   # seed is not in the id
    assert {r.seed for r in expand(reseeded)}.isdisjoint({r.seed for r in runs})


def test_derived_values_formulas() -> None:
    assert htb_burst_bytes(20_000_000, 1500) == 2500
    assert htb_burst_bytes(1_000_000, 1500) == 1514         # never below one frame
    assert htb_burst_bytes(5 * 10**9, 1500) == 625_000
    assert bdp_bytes(200_000_000, 300_000) == 7500
    # docs/guards.md#g-floor: W_s = rate / (N frame 8) (RTT + threshold), frame = MTU + 18
    assert window_segments(200_000_000, 8, 1500, 100_000) == pytest.approx(200e6 / (8 * 1518 * 8) * 100e-6)
    runs = expand(load_plan(STUDY), order="cells")
    one = next(r for r in runs if r.experiment == "1")
    assert one.derived.bdp_bytes == 7500
    assert one.derived.submss is False
    assert next(r for r in runs if r.experiment == "3A").derived.submss is True


def test_cli_outputs(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert cmd_expand(QUICKSTART, True, out, err) == 0 and err.getvalue() == ""
    runs = json.loads(out.getvalue())
    assert isinstance(runs, list) and len(runs) == 8
    assert all({"run_id", "experiment", "params", "derived"} <= set(r) for r in runs)
    assert [RunSpec.model_validate(r).run_id for r in runs] == [r["run_id"] for r in runs]
    out = io.StringIO()
    assert cmd_validate(QUICKSTART, out, io.StringIO()) == 0 and "8 runs" in out.getvalue()
    out = io.StringIO()
    assert cmd_table(QUICKSTART, out, io.StringIO()) == 0
    lines = out.getvalue().splitlines()
    # study layout: rows = parameters, one column per matrix cell of the single experiment
    assert lines[0].split() == ["parameter"] + [f"main.{k}" for k in range(1, 9)]
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines[2:] if ln and not ln.startswith("same")}
    assert rows["cc"] == ["reno"] * 4 + ["cubic"] * 4 and rows["rate"] == ["20mbit", "20mbit", "50mbit", "50mbit"] * 2
    assert rows["htb_burst_bytes"] == ["2500", "2500", "6250", "6250"] * 2 and rows["runs"] == ["1"] * 8
    out = io.StringIO()
    assert cmd_expand(QUICKSTART, False, out, io.StringIO()) == 0 and len(out.getvalue().splitlines()) == 8


def test_plans_built_in_python_are_checked_as_files_are() -> None:
    from orchestrator.plan import Plan, PlanError, check_plan

    doc = {"name": "py", "run": {"duration": "5s", "traffic": {"src": "server", "dst": "client", "cc": "reno",
                                                               "flows": 1, "duration": "9s"}}}
    with pytest.raises(PlanError, match=r"<plan py>:1:1: run.traffic.duration: .*flow longer than the run"):
        check_plan(Plan.model_validate(doc))
    doc["run"]["traffic"]["duration"] = "5s"
    (run,) = expand(check_plan(Plan.model_validate(doc)))
    assert run.run_id.startswith("py-main-") and run.hosts["aqm"].qdiscs == {}
