"""The walk over every qdisc kind: each kind the registry, the `apply` contract or the plan accepts has all its
parts (tc argv, expected read-back, buffer, probe, a read-back fixture), every stage field is compared on
read-back or named as invisible to tc, and each kind's argv -> read-back round trip holds on literal `tc -j`
output (tests/fixtures/tc/, see its README): the stage's argv is the fixture's command, its expected read-back
matches the fixture, and changing any option makes the read-back report it. Kinds tc cannot configure (the
agent sends their netlink options: mark, dualpi2) do the same on the guest kernel's literal dump.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest
from pydantic import ValidationError

from orchestrator.plan.model import qdiscs as plan_qdiscs
from schemas import hoststate
from schemas.qdiscs import (
    KINDS,
    Bfifo,
    Cake,
    Codel,
    DualPi2,
    Fq,
    FqCodel,
    FqPie,
    Htb,
    Mark,
    Netem,
    Pfifo,
    Pie,
    Red,
    Tbf,
    option_differences,
)
from schemas.qdiscs.htb import class_readback
from tests.unit.test_aqm_mark_pure import DUMP_EST_X86
from tests.unit.test_dualpi2_pure import GUEST_DUMP

ROOT = Path(__file__).resolve().parents[2]
TC = ROOT / "tests" / "fixtures" / "tc"

# kinds this agent version cannot apply yet, and why: they have no argv, read-back, probe or fixture. A kind
# listed here must say so in its registry entry (`pending`), and the other way round.
PENDING: dict[str, str] = {}


@dataclass(frozen=True)
class Fixture:
    """A literal read-back of one stage: `name` in tests/fixtures/tc/, the stage's handle there, the stage
    that produced it, and the words its argv adds to the fixture's command that only spell out tc's default
    (the fixture was built by hand with the default left out)."""

    name: str
    handle: str
    stage: object
    spelled_out_defaults: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}:{self.handle}"


RAMP = Red(limit_bytes=500_000, min_bytes=25_000, max_bytes=75_000, avpkt_bytes=1000, burst_packets=42,
           probability=0.1, bandwidth_bit=20_000_000, ecn=True, adaptive=True)
FIXTURES: dict[str, list[Fixture]] = {
    "htb": [Fixture("htb_pfifo", "1:", Htb(rate_bit=20_000_000, burst_bytes=2500)),
            Fixture("htb_bfifo", "1:", Htb(rate_bit=50_000_000, ceil_bit=60_000_000, burst_bytes=62_500,
                                           cburst_bytes=75_000, quantum_bytes=3028))],
    "tbf": [Fixture("tbf", "1:", Tbf(rate_bit=20_000_000, burst_bytes=5000, limit_bytes=30_000)),
            Fixture("tbf_burst_limit", "1:", Tbf(rate_bit=50_000_000, burst_bytes=32_768, limit_bytes=150_000)),
            Fixture("tbf_limit_below_burst", "1:", Tbf(rate_bit=20_000_000, burst_bytes=30_000, limit_bytes=20_000)),
            Fixture("tbf_pfifo", "1:", Tbf(rate_bit=20_000_000, burst_bytes=5000, limit_bytes=30_000))],
    "pfifo": [Fixture("htb_pfifo", "2:", Pfifo(limit_packets=100)),
              Fixture("tbf_pfifo", "2:", Pfifo(limit_packets=50))],
    "bfifo": [Fixture("htb_bfifo", "2:", Bfifo(limit_bytes=150_000))],
    "netem": [Fixture("netem_htb_red_ecn", "1:", Netem(delay_ns=10_000_000, limit_packets=1000)),
              Fixture("netem_jitter_loss", "1:", Netem(delay_ns=5_000_000, jitter_ns=1_000_000,
                                                       distribution="normal", loss=0.01, limit_packets=2000))],
    "red": [Fixture("netem_htb_red_ecn", "3:", RAMP)],
    "fq_codel": [Fixture("htb_fq_codel", "2:", FqCodel(), ("ecn",))],
    "codel": [Fixture("htb_codel", "2:", Codel(), ("noecn",))],
    "pie": [Fixture("htb_pie_ecn", "2:", Pie(ecn=True))],
    "fq_pie": [Fixture("htb_fq_pie", "2:", FqPie(ecn=False), ("no_ecn",))],
    "cake": [Fixture("htb_cake", "2:", Cake(bandwidth_bit=20_000_000), ("no-ack-filter",))],
    "fq": [Fixture("fq_maxrate", "1:", Fq(maxrate_bit=50_000_000), ("pacing",))],
}
ALL_FIXTURES = [f for fixtures in FIXTURES.values() for f in fixtures]
# kinds tc cannot configure (the agent sends their netlink options): a stage and the read-back document of
# the guest kernel's literal dump of it (tests/unit/test_aqm_mark_pure.py: step, est, 2 ms, 1000 packets;
# tests/unit/test_dualpi2_pure.py: limit 1000 and the defaults written out, alpha 41 dumped as 40)
DUALPI2_SAMPLE = DualPi2(limit_packets=1000, target_ns=15_000_000, tupdate_ns=16_000_000, alpha=41, beta=819,
                         step_thresh_ns=1_000_000, coupling_factor=2, ecn_mask="l4s_ect", split_gso=True)
NETLINK_SAMPLES = {"mark": (Mark(mode="step", metric="est", min_ns=2_000_000, limit_packets=1000),
                            {"kind": "aqm_mark", "netlink": {"options_hex": DUMP_EST_X86.hex()}}),
                   "dualpi2": (DUALPI2_SAMPLE, {"kind": "dualpi2", "netlink": {"options_hex": GUEST_DUMP.hex()}})}


def sample(name: str):
    """A stage of the kind: the one behind its first fixture (a netlink kind: its sample)."""
    found = FIXTURES.get(name) or []
    assert found or name in NETLINK_SAMPLES, f"{name}: no read-back fixture (tests/fixtures/tc/) in FIXTURES"
    return found[0].stage if found else NETLINK_SAMPLES[name][0]


def _tags(union) -> set[str]:
    members = get_args(get_args(union)[0]) if get_origin(union) is not None and get_args(union) else ()
    return {m.model_fields["kind"].default for m in members}


def union_kinds() -> set[str]:
    """Kinds the `apply` contract accepts (schemas.hoststate's chain union)."""
    return _tags(hoststate.InterfaceState.model_fields["qdiscs"].annotation.__args__[0])


def plan_kinds() -> set[str]:
    """Kinds a plan may write: the plan models' stage and queue unions, and the generated plan schema."""
    in_models = _tags(plan_qdiscs.Stage) | _tags(plan_qdiscs.Queue)
    schema = json.loads((ROOT / "schemas" / "plan.schema.json").read_text())
    in_schema = {d["properties"]["kind"]["default"] for d in schema["$defs"].values()
                 if "kind" in d.get("properties", {}) and "default" in d["properties"]["kind"]}
    assert in_models == in_schema, "plan models and schemas/plan.schema.json disagree: regenerate the schema"
    return in_models


EVERY_KIND = sorted(set(KINDS) | union_kinds() | plan_kinds() | set(FIXTURES) | set(PENDING))


# --- every kind has every part ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", EVERY_KIND)
def test_every_kind_has_every_part(name: str) -> None:
    assert name in KINDS, f"{name}: no registry entry in schemas/qdiscs/"
    kind = KINDS[name]
    assert name in union_kinds(), f"{name}: not in the apply contract's stage union"
    assert name in plan_kinds(), f"{name}: no plan surface model in orchestrator/plan/qdiscs.py"
    assert callable(kind.buffer_packets), f"{name}: no buffer size"
    assert isinstance(kind.leaf_only, bool)
    if name in PENDING:
        assert kind.pending, f"{name}: listed as pending here but its registry entry names no reason"
        assert (kind.params, kind.expected, kind.probe) == (None, None, None), \
            f"{name}: pending, yet it has an argv, read-back or probe: take it off PENDING and give it a fixture"
        return
    assert kind.pending is None, f"{name}: pending in the registry ({kind.pending}) but not listed in PENDING"
    assert (kind.params is None) != (kind.netlink is None), f"{name}: needs one builder: tc argv or netlink options"
    assert kind.expected is not None, f"{name}: no expected read-back"
    assert kind.probe, f"{name}: no capability probe"
    assert kind.probe[0] == kind.tc_kind, f"{name}: the probe adds {kind.probe[0]}, not the kind itself"
    assert FIXTURES.get(name) or name in NETLINK_SAMPLES, f"{name}: no read-back fixture (tests/fixtures/tc/)"
    assert (kind.class_params is None) == (kind.class_readback is None), \
        f"{name}: a class needs both its argv and its read-back"
    assert not (kind.class_params and kind.leaf_only), f"{name}: a classful kind takes a child"


@pytest.mark.parametrize("name", sorted(set(KINDS) - set(PENDING)))
def test_every_stage_field_is_compared_or_named_unseen(name: str) -> None:
    kind = KINDS[name]
    stage = sample(name)
    covered = {f for e in kind.expected(stage) for f in e.fields}
    fields = set(kind.stage.model_fields) - {"kind"}
    assert not set(kind.unseen) - fields, f"{name}: `unseen` names fields the stage does not have"
    assert fields - covered - set(kind.unseen) == set(), f"{name}: applied but never compared on read-back"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_buffer_is_whole_packets(name: str) -> None:
    got = KINDS[name].buffer_packets(sample(name), 1500)
    assert isinstance(got, int) and got >= 0


@pytest.mark.parametrize(("stage", "packets"), [
    (Pfifo(limit_packets=100), 100), (Bfifo(limit_bytes=150_000), 100), (RAMP, 334),
    (Tbf(rate_bit=20_000_000, burst_bytes=5000, limit_bytes=30_000), 20), (Netem(delay_ns=0, limit_packets=7), 7),
    (FqCodel(), 10240), (FqCodel(limit_packets=500), 500), (Codel(), 1000), (Pie(), 1000), (FqPie(), 10240),
    (DualPi2(), 10000), (Fq(), 10000), (Cake(), 0), (Htb(rate_bit=10**9), 0), (NETLINK_SAMPLES["mark"][0], 1000)])
def test_buffer_in_packets_at_a_1500_byte_mtu(stage, packets: int) -> None:
    # what G-NETEM adds below a netem: a limit in bytes in whole packets, an unset packet limit at tc's default
    assert KINDS[stage.kind].buffer_packets(stage, 1500) == packets


def test_the_agent_probes_every_kind_it_can_apply() -> None:
    from agents.host.capabilities import qdisc_probes
    probes = qdisc_probes()
    assert {name for name, k in KINDS.items() if not k.pending} <= set(probes)
    assert not set(PENDING) & set(probes)   # never probed, so never in the capabilities: the plan is refused


@pytest.mark.parametrize("name", sorted(NETLINK_SAMPLES))
def test_a_netlink_kind_reads_back_from_the_kernels_dump(name: str) -> None:
    stage, shown = NETLINK_SAMPLES[name]
    assert option_differences(stage, shown) == []
    assert option_differences(stage, {"kind": shown["kind"], "netlink": None})   # no dump: reported, not passed


NETLINK_CHANGES = [(name, field) for name, (stage, _) in sorted(NETLINK_SAMPLES.items())
                   for field in type(stage).model_fields if field != "kind"]


@pytest.mark.parametrize(("name", "field"), NETLINK_CHANGES)
def test_a_changed_netlink_option_is_reported(name: str, field: str) -> None:
    stage, shown = NETLINK_SAMPLES[name]
    reported = _changed_readbacks(stage, field, shown)
    assert reported, f"no valid alternative value for {field}"
    assert any(reported), f"{name}: changing {field} is not reported by the read-back"


def test_mark_options_are_named_when_they_differ() -> None:
    stage, shown = NETLINK_SAMPLES["mark"]
    for field, other in (("min_ns", 3_000_000), ("metric", "sojourn"), ("limit_packets", 999), ("on_dequeue", False),
                         ("mode", "ramp")):
        extra = {"max_ns": 5_000_000} if field == "mode" else {}
        changed = stage.model_copy(update={field: other, **extra})
        assert any(d.startswith(f"{field} ") for d in option_differences(changed, shown)), field
    assert option_differences(stage, {"kind": "aqm_mark", "netlink": None})   # no dump: reported, not passed


# --- the argv -> read-back round trip on each fixture ---------------------------------------------------

UNIT_NS = {"us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
UNIT_BIT = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}


def _norm(word: str) -> object:
    """One tc word in canonical units: "10ms" and "10000us" are the same time, "20mbit" the same rate."""
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)", word):
        return ("ns", round(float(m.group(1)) * UNIT_NS[m.group(2)]))
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", word):
        return ("bit", round(float(m.group(1)) * UNIT_BIT[m.group(2)]))
    return word


def fixture_commands(f: Fixture) -> tuple[list[str], list[str] | None]:
    """The qdisc's parameters (after `handle H:`) and its class's (after `classid H1`) in the fixture's .cmd."""
    lines = [ln.split() for ln in (TC / f"{f.name}.cmd").read_text().splitlines() if ln.startswith("tc ")]
    lines = [w for w in lines if w[2] == "add"]
    qdisc = next(w for w in lines if w[1] == "qdisc" and w[w.index("handle") + 1] == f.handle)
    cls = [w for w in lines if w[1] == "class" and w[w.index("classid") + 1] == f"{f.handle}1"]
    return qdisc[qdisc.index("handle") + 2:], (cls[0][cls[0].index("classid") + 2:] if cls else None)


def shown(f: Fixture) -> dict:
    """The stage's read-back document: its qdisc object in the fixture, its htb class under "class"."""
    q = next(q for q in json.loads((TC / f"{f.name}.json").read_text()) if q["handle"] == f.handle)
    if KINDS[q["kind"]].class_readback is None:
        return q
    classes = json.loads((TC / f"{f.name}.class-netlink.json").read_text())
    return {**q, "class": class_readback(f"{f.handle}1", classes, (TC / f"{f.name}.class.txt").read_text())}


@pytest.mark.parametrize("f", ALL_FIXTURES, ids=str)
def test_the_stage_argv_is_the_fixture_command(f: Fixture) -> None:
    kind = KINDS[f.stage.kind]
    argv = kind.params(f.stage)
    for word in f.spelled_out_defaults:
        assert word in argv, f"{word!r} is not in the argv {argv}"
    qdisc_cmd, class_cmd = fixture_commands(f)
    assert [_norm(w) for w in argv if w not in f.spelled_out_defaults] == [_norm(w) for w in qdisc_cmd]
    if kind.class_params is not None:
        assert [_norm(w) for w in kind.class_params(f.stage)] == [_norm(w) for w in class_cmd]


@pytest.mark.parametrize("f", ALL_FIXTURES, ids=str)
def test_the_expected_readback_matches_the_fixture(f: Fixture) -> None:
    doc = shown(f)
    assert doc["kind"] == f.stage.kind
    assert option_differences(f.stage, doc) == []


def _alternatives(stage, name: str) -> list:
    """Other values for one field: flipped flags, other literals, scaled or (unset ->) arbitrary numbers."""
    value, annotation = getattr(stage, name), type(stage).model_fields[name].annotation
    members = (annotation,) if get_origin(annotation) is Literal else (get_args(annotation) or (annotation,))
    literals = [a for t in members if get_origin(t) is Literal for a in get_args(t)]
    if literals:
        return [v for v in literals if v != value]
    if isinstance(value, bool) or bool in get_args(annotation) or annotation is bool:
        return [not value] if value is not None else [True, False]
    if isinstance(value, float) or float in get_args(annotation) or annotation is float:
        return [value / 2, min(1.0, value * 3)] if value else [0.5]
    return [value * 2, value // 2, value + 3000] if value else [3, 17, 3_000_000]


CHANGES = [(f, name) for f in ALL_FIXTURES for name in type(f.stage).model_fields
           if name != "kind" and name not in KINDS[f.stage.kind].unseen]


def _changed_readbacks(stage, name: str, doc: dict) -> list[list[str]]:
    """The read-back's differences for each valid alternative value of one field (doc shows `stage`)."""
    reported = []
    for value in _alternatives(stage, name):
        try:
            changed = type(stage).model_validate({**stage.model_dump(), name: value})
        except ValidationError:
            continue
        reported.append(option_differences(changed, doc))
    return reported


@pytest.mark.parametrize(("f", "name"), CHANGES, ids=lambda x: str(x))
def test_a_changed_option_is_reported(f: Fixture, name: str) -> None:
    reported = _changed_readbacks(f.stage, name, shown(f))
    assert reported, f"no valid alternative value for {name}"
    assert any(reported), f"{f}: changing {name} is not reported by the read-back"


def test_a_changed_dualpi2_or_tbf_option_is_named() -> None:
    stage, dump = NETLINK_SAMPLES["dualpi2"]
    assert option_differences(stage.model_copy(update={"ecn_mask": "any_ect", "split_gso": False, "alpha": 82,
                                                       "step_thresh_ns": 2_000_000}), dump) == [
        "alpha 40 != 81 (as the kernel rounds it)", "step_thresh_us 1000 != 2000", "ecn_mask l4s_ect != any_ect",
        "split_gso True != False"]
    # alpha 41 and beta 819 (the kernel's defaults) are dumped as 40 and 818, and compared as such
    assert option_differences(stage.model_copy(update={"alpha": 40, "beta": 818}), dump) == [
        "alpha 40 != 39 (as the kernel rounds it)", "beta 818 != 817 (as the kernel rounds it)"]
    tbf = FIXTURES["tbf"][1]
    assert option_differences(tbf.stage.model_copy(update={"burst_bytes": 65_536, "limit_bytes": 300_000}),
                                shown(tbf)) == [
        "burst 32768 != 65536 bytes", "lat 18758 != 37514.24 us (limit 300000 B = burst + lat x rate)"]


# (min, burst, avpkt, bandwidth bit/s) -> (ewma, Scell_log) as tc 6.1 itself computed them: read from the
# tc_red_qopt of the netlink message `tc qdisc add ... red` sent (strace -e write=all), for a sample of the
# study plans' RED stages and of odd sizes and rates (at 10 Gbit/s an avpkt takes under 1 µs: cell log 0)
TC_RED_LOGS = [
    ((25_000, 42, 1000, 20_000_000), (5, 14)), ((3000, 3, 1500, 20_000_000), (2, 11)),
    ((10_625, 8, 1500, 100_000_000), (1, 8)), ((18_750, 3, 9000, 600_000_000), (2, 9)),
    ((18_750, 32, 1000, 600_000_000), (5, 9)), ((12_500, 21, 1000, 200_000_000), (4, 10)),
    ((5000, 9, 1000, 20_000_000), (3, 12)), ((1234, 9, 777, 3_333_333), (6, 17)),
    ((1234, 9, 777, 10_000_000_000), (6, 0)), ((150_000, 120, 1514, 10_000_000_000), (5, 5)),
    ((150_000, 120, 1514, 99_999_999), (5, 12)), ((3000, 3, 1500, 10_000_000_000), (2, 2)),
]


@pytest.mark.parametrize(("given", "logs"), TC_RED_LOGS)
def test_red_derives_what_tc_derives(given: tuple[int, int, int, int], logs: tuple[int, int]) -> None:
    min_bytes, burst, avpkt, bandwidth = given
    red = Red(limit_bytes=10**6, min_bytes=min_bytes, max_bytes=min_bytes + 1, avpkt_bytes=avpkt,
              burst_packets=burst, probability=0.1, bandwidth_bit=bandwidth)
    wanted = {e.label: e.want for e in KINDS["red"].expected(red)}
    assert (wanted["ewma"], wanted["Scell_log"]) == logs
