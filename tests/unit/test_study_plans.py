"""The reference studies as plans (experiments/): every plan validates, expands and matches the study's
matrix; LS-AIMD Table 5.1 is checked cell by cell against the study's inputs (its Table 5.1)."""
from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import yaml

from orchestrator.plan import RunSpec, expand, load_plan
from orchestrator.plan.commands import cmd_table
from schemas.hoststate import Htb, Netem, Red
from tests.support.shipped import STUDY_PLANS

ROOT = Path(__file__).resolve().parents[2]
PLANS = STUDY_PLANS
LSAIMD = ROOT / "experiments" / "lsaimd" / "table-5-1.yaml"

# the LS-AIMD study's experiment matrix, transcribed: rate Mbit/s, base RTT us, MTU, flows, flow duration s, target us
TABLE_5_1 = {
    "1": (200, 300, 1500, 1, 10, 500), "2": (200, 300, 1500, 2, 20, 500),
    "3A": (200, 100, 1500, 8, 40, 500), "3B": (200, 100, 1500, 8, 40, 500),
    **{e: (600, rtt, 1500, 16, 40, 250) for e, rtt in zip("4A 4B 4C 4D".split(), (250, 500, 750, 1000), strict=True)},
    **{e: (600, rtt, 9000, 16, 40, 250) for e, rtt in zip("4E 4F 4G 4H".split(), (250, 500, 750, 1000), strict=True)},
}


@pytest.fixture(scope="module")
def lsaimd() -> list[RunSpec]:
    return expand(load_plan(LSAIMD), order="cells")


@pytest.mark.parametrize("path", PLANS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_plan_validates_expands_and_fits_the_schema(path: Path) -> None:
    runs = expand(load_plan(path))
    assert runs and len({r.run_id for r in runs}) == len(runs)
    schema = json.loads((ROOT / "schemas" / "plan.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_lsaimd_has_96_runs_per_repetition(lsaimd: list[RunSpec]) -> None:
    plan = load_plan(LSAIMD)
    assert len(lsaimd) == 96 * plan.repetitions
    per_rep = [r for r in lsaimd if r.repetition == 0]
    counts = Counter(r.experiment for r in per_rep)
    # 3 CC x AQM pairings x {AIMD, LS-AIMD C=100%} in 1-3B; x {.., C=0.78125%} in 4A-4H
    assert counts == {e: 6 if e in ("1", "2", "3A", "3B") else 9 for e in TABLE_5_1}
    pairings = Counter((r.flows[0].cc, r.hosts["sender"].qdiscs["receiver"][2].max_bytes
                        - r.hosts["sender"].qdiscs["receiver"][2].min_bytes == 1) for r in per_rep)
    assert pairings[("reno", False)] == 12 and pairings[("dctcp", True)] == 12   # AIMD: Reno ramp, DCTCP step
    c_values = Counter(r.hosts["sender"].module_params.get("tcp_lsaimd", {}).get("c_shift") for r in per_rep)
    assert c_values == {None: 36, "0": 36, "7": 24}   # C = 100 % everywhere, 2^-7 only in exp 4


@pytest.mark.parametrize("exp", list(TABLE_5_1))
def test_lsaimd_cells_follow_table_5_1(lsaimd: list[RunSpec], exp: str) -> None:
    rate_m, rtt_us, mtu, flows, dur_s, target_us = TABLE_5_1[exp]
    rate = rate_m * 10**6
    for r in (r for r in lsaimd if r.experiment == exp and r.repetition == 0):
        netem, htb, red = r.hosts["sender"].qdiscs["receiver"]
        assert isinstance(netem, Netem) and netem.delay_ns == rtt_us * 1000
        assert isinstance(htb, Htb) and htb.rate_bit == rate and htb.burst_bytes == rate // 8000
        assert isinstance(red, Red) and red.ecn and red.bandwidth_bit == rate and red.limit_bytes == rate // 40
        assert len(r.flows) == flows and {f.duration_s for f in r.flows} == {dur_s}
        assert [f.start_s for f in r.flows] == [float(i) for i in range(flows)]     # flow pace 1 s
        assert [f.port for f in r.flows] == [5201 + i for i in range(flows)]        # port = flow id
        assert r.duration_s == (flows - 1) + dur_s
        # W_s = rate / (N x (MTU + 18) x 8) x (base RTT + target); flagged below 2 segments (G-FLOOR)
        w = rate / (flows * (mtu + 18) * 8) * (rtt_us + target_us) * 1e-6
        assert r.derived.per_flow_window_segments == pytest.approx(w, abs=5e-4)
        assert r.derived.submss == (w < 2)
        assert r.derived.bdp_bytes == -(-rate * rtt_us // 8_000_000)
        t_bytes = rate // 8 * target_us // 10**6
        mode = r.params["arm"].split("-")[1]
        if mode == "ramp":    # min/max = target / 3 x target, burst by the rule of thumb, adaptive, 10 %
            assert (red.min_bytes, red.max_bytes) == (t_bytes, 3 * t_bytes)
            assert red.burst_packets == -(-(2 * t_bytes + 3 * t_bytes) // 3000) and red.adaptive
            assert red.probability == 0.1 and r.flows[0].cc in ("reno", "lsaimd_reno")
        elif mode == "step":  # K = max(rate x target, 2 MTU), max = K + 1, probability 1
            k = max(t_bytes, 2 * mtu)
            assert (red.min_bytes, red.max_bytes, red.probability) == (k, k + 1, 1.0)
            assert r.derived.step_k_bytes == k
        else:                 # instantaneous ramp target .. 2 x target
            assert (red.min_bytes, red.max_bytes, red.probability) == (t_bytes, 2 * t_bytes, 1.0)
            assert not red.adaptive


def test_lsaimd_kernel_variants_and_baseline(lsaimd: list[RunSpec]) -> None:
    kernels = Counter((r.params["arm"].rsplit("-", 1)[1], r.hosts["sender"].kernel.name,
                       r.hosts["sender"].kernel.vanilla) for r in lsaimd if r.repetition == 0)
    assert kernels[("aimd", "vanilla-5.0.0", True)] == 12                 # Reno ramp on the vanilla baseline
    assert kernels[("aimd", "dctcp-hiprec-5.0.0", False)] == 24          # hi-precision DCTCP is NOT vanilla
    assert {r.hosts["receiver"].kernel.name for r in lsaimd} == {"vanilla-5.0.0"}
    stretch = {r.experiment for r in lsaimd if r.ack_policy and r.ack_policy.mode == "stretch"}
    assert stretch == {"3B"} and all(r.ack_policy.hosts == ["receiver"] for r in lsaimd)


def test_lsaimd_plan_table_has_the_study_layout() -> None:
    out = io.StringIO()
    assert cmd_table(LSAIMD, out, io.StringIO()) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["parameter", *TABLE_5_1]
    rows = {ln.split("  ")[0].strip(): ln.split()[-12:] for ln in lines[2:] if ln and not ln.startswith("same")}
    assert rows["rate"] == [f"{v[0]}mbit" for v in TABLE_5_1.values()]
    assert rows["base_rtt"] == [f"{v[1]}us" for v in TABLE_5_1.values()]
    assert rows["mtu"] == [str(v[2]) for v in TABLE_5_1.values()]
    assert rows["flows"] == [str(v[3]) for v in TABLE_5_1.values()]
    assert rows["target_queue"] == [f"{v[5]}us" for v in TABLE_5_1.values()]
    assert rows["red_max_us [reno-ramp-*]"] == [f"{3 * v[5]:g}" for v in TABLE_5_1.values()]
    assert rows["red_max_us [dctcp-inst-*]"] == [f"{2 * v[5]:g}" for v in TABLE_5_1.values()]
    w = [r * 1e6 / (n * (mtu + 18) * 8) * (rtt + tq) * 1e-6 for r, rtt, mtu, n, _, tq in TABLE_5_1.values()]
    assert rows["per_flow_window_segments"] == [f"{x:.6g}" for x in (round(x, 3) for x in w)]
    assert rows["submss"] == ["yes" if x < 2 else "no" for x in w]
    assert rows["runs"] == ["30"] * 4 + ["45"] * 8 and rows["arms"] == ["6"] * 4 + ["9"] * 8


# cells per experiment (one repetition), from each study's published experiment matrix
STUDY_MATRICES = {
    "dctcp-flaws/dc.yaml": {"noise-floor": 1,            # G-AQMNOISE pre-campaign check
                            "df-e1": 2 * 2, "df-e5": 1 * 2 + 2,   # variants x {derived, study's 1-MTU} htb burst
                            "df-e11": 2},
    "dctcp-flaws/prr-and-cubic.yaml": {"df-e2": 2, "df-e3": 2, "df-e4": 2, "df-e6": 1, "df-e7": 2},
    "dctcp-flaws/latecomer.yaml": {"df-e8": 4 + 1, "df-e9": 8, "df-e10": 4},      # + vanilla baseline
    "dctcp-flaws/ewma.yaml": {"df-e12": 2 + 1, "df-e13": 3, "df-e14": 2, "df-e15": 3},
    "dctcp-flaws/est-vs-sojourn.yaml": {"df-e16": 6 * 2 * 7, "df-e17": 6 * 2 * 6,   # variants x metric x sweep
                                        "df-e18": 3 * 2 * 6, "df-e19": 3 * 2 * 6},
    "paced-chirping/chirping.yaml": {"pc-e1": 2, "pc-e2": 3 * 3 * 2, "pc-e3": 3 * 3 * 2, "pc-e4": 5, "pc-e5": 5,
                                     "pc-e6": 6 * 2, "pc-e7": 2 * 2 * 2, "pc-e8": 2, "pc-e9": 6 * 3,
                                     "pc-m1": 1, "pc-m2": 4},
    "paced-chirping/timing.yaml": {"main": 2},
    "thin-stream/thin-stream.yaml": {f"thin-f{k}": 2 for k in range(2, 8)},      # 2 Linux stacks (no FreeBSD)
    "timer-cc/tbtcp.yaml": {"tb-b1": 2, "tb-b2": 2, "tb-b3": 2, "tb-e1": 1, "tb-e2": 3, "tb-e3": 4, "tb-e4": 1,
                            "tb-e5": 1, "tb-e6": 2, "tb-e7": 3, "tb-e8": 2, "tb-e12": 2, "tb-e13": 2,
                            "tb-e14": 2, "tb-e15": 2, "tb-e17": 1, "tb-e18": 1},
    "timer-cc/timing.yaml": {"tb-e9": 2, "tb-e10": 1, "tb-e11": 1, "tb-e16": 2},
}


@pytest.mark.parametrize("name", list(STUDY_MATRICES))
def test_study_plan_matrix_sizes(name: str) -> None:
    runs = expand(load_plan(ROOT / "experiments" / name))
    assert Counter(r.experiment for r in runs if r.repetition == 0) == STUDY_MATRICES[name]
    # G-BASELINE: a plan that runs a patched kernel also runs a vanilla one
    kernels = {(h.kernel.name, h.kernel.vanilla) for r in runs for h in r.hosts.values() if h.kernel}
    assert not kernels or any(v for _, v in kernels)


def test_every_study_has_a_plan() -> None:
    folders = {p.parent.name for p in PLANS}
    assert {"lsaimd", "dctcp-flaws", "paced-chirping", "timer-cc", "thin-stream"} <= folders
