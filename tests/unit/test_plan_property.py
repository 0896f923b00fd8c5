"""Property tests: whatever the input, the validator only ever raises PlanError (or returns a Plan)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.plan import PlanError, expand, load_plan_text
from tests.support.docpaths import key_paths

ROOT = Path(__file__).resolve().parents[2]
BASES = [yaml.safe_load(p.read_text()) for p in
         (ROOT / "experiments" / "quickstart.yaml", *sorted((ROOT / "tests" / "plans").glob("good_*.yaml")))]

FIELD_WORDS = ["rate", "duration", "flows", "cc", "queue", "limit", "kind", "at", "host", "toward", "axes",
               "zip", "include", "exclude", "set", "name", "arms", "per_flow", "start", "stagger", "burst",
               "traffic.cc", "bottleneck.rate", "base_rtt", "hosts.all.sysctls.net.ipv4.tcp_ecn"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["20mbit", "5s", "0", "1/16", "10%", "64KiB", "mbps", "pfifo", "htb", "reno", "aqm",
                     "client", "server", "1e9", "-1s", "", " ", "µs", "all"]),
    st.text(max_size=12),
)
keys = st.one_of(st.sampled_from(FIELD_WORDS), st.text(min_size=1, max_size=8), st.integers(-3, 300))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=4)), max_leaves=12)


def _check(text: str) -> None:
    try:
        plan = load_plan_text(text, "p.yaml")
    except PlanError as exc:
        assert exc.issues and all(i.line >= 1 and i.col >= 1 for i in exc.issues)
        return
    expand(plan)   # a plan that loads must expand


@st.composite
def mutated_plans(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in key_paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for seg in path[:-1]:
            parent = parent[seg]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        else:
            parent.append(draw(values))
    return doc


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(mutated_plans())
def test_mutated_plans_only_raise_plan_error(doc: Any) -> None:
    _check(yaml.safe_dump(doc, allow_unicode=True))


@SETTINGS
@given(values)
def test_random_documents_only_raise_plan_error(doc: Any) -> None:
    _check(yaml.safe_dump(doc, allow_unicode=True))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_random_text_only_raises_plan_error(text: str) -> None:
    _check(text)


RUN_ID_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


@st.composite
def valid_plans(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """Quickstart-shaped plans built from valid parts, with the number of runs they must give."""
    doc = copy.deepcopy(BASES[0])
    rates = draw(st.lists(st.sampled_from(["10mbit", "20Mbit", "1.5gbit", "750kbit", "100 mbit/s"]),
                          min_size=1, max_size=3, unique_by=lambda r: r.lower().replace(" ", "")[:4]))
    ccs = draw(st.lists(st.sampled_from(["reno", "cubic", "bbr", "dctcp"]), min_size=1, max_size=3, unique=True))
    flows = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3, unique=True))
    reps = draw(st.integers(1, 3))
    doc["repetitions"], doc["order"] = reps, draw(st.sampled_from(["cells", "rounds", "random"]))
    doc["seed"] = draw(st.integers(0, 2**40))
    doc["run"]["traffic"]["stagger"] = draw(st.sampled_from(["0s", "100ms", "500ms"]))
    doc["matrix"] = {"axes": {"bottleneck.rate": rates, "traffic.cc": ccs, "traffic.flows": flows}}
    return doc, len(rates) * len(ccs) * len(flows) * reps


@settings(max_examples=150, deadline=None)
@given(valid_plans())
def test_valid_plans_expand_to_the_product(case: tuple[dict[str, Any], int]) -> None:
    doc, expected = case
    runs = expand(load_plan_text(yaml.safe_dump(doc), "p.yaml"))
    assert len(runs) == expected
    assert len({r.run_id for r in runs}) == expected
    assert all(set(r.run_id) <= RUN_ID_CHARS and len(r.run_id) <= 128 for r in runs)
    for r in runs:
        assert all(f.start_s + f.duration_s <= r.duration_s + 1e-9 for f in r.flows)
        assert len({f.port for f in r.flows}) == len(r.flows) == r.params["flows"]
        assert r.hosts["aqm"].qdiscs["client"][0].rate_bit == r.params["rate_bit"]
