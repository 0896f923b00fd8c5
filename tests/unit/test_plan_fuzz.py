"""Fuzzing the plan loader (issue 13, item 8): over 10,000 hostile plans, 0 crashes, 0 hangs, every error
located.

Plans are the shipped ones (tests/plans/good_*.yaml, experiments/**/*.yaml) with their matrices cut to two
values an axis (so a valid plan loads in milliseconds), then mutated: a value replaced by a hostile YAML
token written into the text as is (huge numbers and exponents, .inf/.nan, YAML 1.1 forms, NUL/surrogate/
newline escapes, explicit tags, deep nesting, big lists, alias bombs), a key deleted, duplicated or made
hostile, a value replaced by a random tree; and random text. A crash is any exception but PlanError (a
plan that loads is expanded too); a hang a case over HANG_S; located means every issue has a file, a line
and a column >= 1 and prints as one printable line.
"""
from __future__ import annotations

import copy
import json
import signal
import time
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.plan import PlanError, expand, load_plan_text
from tests.support.docpaths import key_paths
from tests.support.shipped import STUDY_PLANS

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 10.0    # a case slower than this is a hang (the slowest valid case: ~0.9 s quiet, ~2 s on a loaded machine)
STUCK_S = 20.0   # ... and one this slow is stopped, so a real hang fails the test instead of stalling it
PLAN_FILES = [*sorted((ROOT / "tests" / "plans").glob("good_*.yaml")), *STUDY_PLANS]


def _small(doc: Any) -> Any:
    """The plan with every matrix list cut to 2 values and one repetition: the same fields, fewer cells."""
    if isinstance(doc, dict):
        out = {k: _small(v) for k, v in doc.items()}
        for key in ("axes",):
            if isinstance(out.get(key), dict):
                out[key] = {d: v[:2] if isinstance(v, list) else v for d, v in out[key].items()}
        if isinstance(out.get("zip"), list):
            out["zip"] = [{d: v[:2] if isinstance(v, list) else v for d, v in g.items()} if isinstance(g, dict)
                          else g for g in out["zip"]]
        if "repetitions" in out and isinstance(out["repetitions"], int):
            out["repetitions"] = 1
        if isinstance(out.get("experiments"), list):
            out["experiments"] = out["experiments"][:3]
        return out
    if isinstance(doc, list):
        return [_small(v) for v in doc]
    return doc


BASES = [_small(yaml.safe_load(p.read_text())) for p in PLAN_FILES]
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)   # libyaml's emitter: generating a case costs < 1 ms

_BOMB = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + [
    f"&{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcdefg", "bcdefgh", strict=True)]) + "]"
HOSTILE_TOKENS = [
    # numbers: exponents and digit counts that once hung or crashed, and values at the edges
    "1e-999999999", "1e999999999", '"1e-999999999"', "'1e999999999'", "1e-400", "1e400", "'1e-400'",
    "9" * 5000, "'" + "9" * 5000 + "'", "-" + "9" * 41, "0x" + "f" * 60, "18446744073709551616", "-1", "0", "-0.0",
    "1.7976931348623157e308", "5e-324", ".inf", "-.inf", ".nan", ".NaN", "'inf'", "'nan'", "'Infinity'",
    "'10%'", "'150%'", "'1/0'", "'0/0'", "'1/16'", "'9999999999999999999999999999999999999999tbit'",
    "'1e3mbit'", "'1.5e-3ms'", "'0.17bdp'", "'1e-999999bdp'", "'1e999target'", "2h", "100s", "9tbit",
    # YAML 1.1 forms
    "1:30:00", "190:20:30", "010", "0o17", "0b1010", "1_000", "yes", "no", "on", "off", "y", "N", "~", "null",
    "2024-01-01", "2001-12-14t21:59:43.10-05:00",
    # strings that are not plain text
    '"\\0"', '"\\ud800"', '"a\\nb"', '"\\x00\\x01\\x7f"', '"\\u202e"', "''", "' '", '"' + "x" * 20_000 + '"',
    # explicit tags, anchors and aliases
    "!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1]", "!!python/object:os.system x", "!!timestamp 2001-01-01",
    "!!int 12_000", "!!float abc", "!!bool yes", "!!str 5s", "*undefined", "&anchor 5s", _BOMB,
    # shapes
    "[" * 60 + "]" * 60, "{a: " * 45 + "1" + "}" * 45, "[" + "1, " * 3000 + "1]", "[]", "{}", "[[]]",
    "{" + ", ".join(f"k{i}: {i}" for i in range(2000)) + "}",
]
HOSTILE_KEYS = ["on", "yes", "010", "1:30", "true", "null", '"\\0"', '"\\ud800"', '"a\\nb"', "[1, 2]", "{a: 1}",
                "'traffic.flows'", "'bottleneck.rate'", "'duration'", "'no.such.field'", "99999",
                '"' + "k" * 3000 + '"']

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**80, 2**80),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.text(st.characters(blacklist_categories=()), max_size=20))
trees = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                     max_leaves=10)


def _token(value: Any) -> str:
    """A Python value as a YAML flow token (JSON is YAML; inf/nan and lone surrogates as escapes)."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True).replace("NaN", ".nan").replace("Infinity", ".inf")


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    """The container holding `path`, or None when an earlier mutation removed or replaced it."""
    for seg in path[:-1]:
        if isinstance(doc, dict) and seg in doc or isinstance(doc, list) and isinstance(seg, int) and seg < len(doc):
            doc = doc[seg]
        else:
            return None
    last = path[-1]
    holds = isinstance(doc, dict) and last in doc or isinstance(doc, list) and isinstance(last, int) and last < len(doc)
    return doc if holds else None


BASE_PATHS = [[p for p in key_paths(doc) if p] for doc in BASES]   # computed once: a case reuses its base's


@st.composite
def mutated_plans(draw: st.DrawFn) -> str:
    k = draw(st.integers(0, len(BASES) - 1))
    doc = copy.deepcopy(BASES[k])
    holes: dict[str, str] = {}
    for n in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(BASE_PATHS[k]))
        parent, last = _parent(doc, path), path[-1]
        if parent is None:
            continue
        op = draw(st.sampled_from(["token", "token", "token", "tree", "delete", "duplicate", "key"]))
        hole = f"__HOLE{n}__"
        if op == "token":
            holes[hole] = draw(st.sampled_from(HOSTILE_TOKENS))
            parent[last] = hole
        elif op == "tree":
            holes[hole] = _token(draw(trees))
            parent[last] = hole
        elif op == "delete":
            if isinstance(parent, dict):
                del parent[last]
            else:
                parent.pop(last)
        elif isinstance(parent, dict):   # a duplicated key, or a hostile one, written into the text
            holes[hole] = str(last) if op == "duplicate" else draw(st.sampled_from(HOSTILE_KEYS))
            parent[hole] = copy.deepcopy(parent[last]) if op == "duplicate" else 1
    if draw(st.integers(0, 3)):   # JSON is YAML (flow style), and 10x faster to write than block YAML
        text = json.dumps(doc, indent=draw(st.sampled_from([None, 1])), ensure_ascii=False)
        for hole, token in holes.items():
            text = text.replace(f'"{hole}"', token)
        return text
    text = yaml.dump(doc, Dumper=DUMPER, sort_keys=False, default_flow_style=False, width=1000)
    for hole, token in holes.items():
        text = text.replace(hole, token)
    return text


yamlish = st.text(st.sampled_from(list(":-[]{},&*!|>'\"#%@`?~ \n\t0123456789.eE+xabnoyfrt\\")), max_size=200)
random_text = st.one_of(yamlish, st.text(st.characters(blacklist_categories=()), max_size=200))


class _Stuck(BaseException):
    """Raised by the alarm in a case that runs past STUCK_S: a hang is counted, not waited for."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Stuck


def _outcome(text: str) -> tuple[str, float]:
    """("ok" | "located" | "unlocated: ..." | "crash: ..." | "stuck", seconds)."""
    t0 = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, STUCK_S)
    try:
        expand(load_plan_text(text, "fuzz.yaml"))   # a plan that loads must expand
        result = "ok"
    except _Stuck:
        result = "stuck"
    except PlanError as exc:
        bad = [i for i in exc.issues if not (i.file and i.line >= 1 and i.col >= 1 and str(i).isprintable()
                                             and "\n" not in str(i))]
        result = f"unlocated: {bad[0]!r}" if bad or not exc.issues else "located"
    except Exception as exc:  # noqa: BLE001 - the property under test: nothing but PlanError escapes
        result = f"crash: {type(exc).__name__}: {exc}"[:300]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return result, time.monotonic() - t0


def _fuzz(ledger: Any, name: str, strategy: st.SearchStrategy[str], examples: int) -> None:
    tally = {"cases": 0, "ok": 0, "crashes": 0, "hangs": 0, "unlocated": 0, "slowest": 0.0}
    failures: list[str] = []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(text: str) -> None:
        result, seconds = _outcome(text)
        tally["cases"] += 1
        tally["slowest"] = max(tally["slowest"], seconds)
        tally["ok"] += result == "ok"
        for kind, prefix in (("crashes", "crash"), ("unlocated", "unlocated")):
            if result.startswith(prefix):
                tally[kind] += 1
                failures.append(f"{result}\n--- plan ---\n{text[:2000]}")
        if seconds > HANG_S:
            tally["hangs"] += 1
            failures.append(f"{seconds:.1f} s\n--- plan ---\n{text[:2000]}")

    t0 = time.monotonic()
    one()
    wall = time.monotonic() - t0
    ledger.fuzz(f"plans ({name})", cases=tally["cases"], crashes=tally["crashes"], hangs=tally["hangs"],
                detail=f"{tally['ok']} valid, {tally['unlocated']} unlocated, slowest "
                       f"{tally['slowest'] * 1000:.0f} ms, {wall:.0f} s")
    print(f"fuzz plans ({name}): {tally} in {wall:.1f} s")
    assert not failures, failures[:3]
    assert tally["cases"] >= examples * 0.9


def test_plan_fuzz_mutated_values(ledger: Any) -> None:
    _fuzz(ledger, "mutated", mutated_plans(), 5000)


def test_plan_fuzz_random_text(ledger: Any) -> None:
    _fuzz(ledger, "random text", random_text, 5000)


def test_plans_load_unmutated_and_fast() -> None:
    """The cut-down bases are valid plans (so mutations reach every pass) and load in milliseconds."""
    for doc in BASES:
        result, seconds = _outcome(yaml.safe_dump(doc, sort_keys=False))
        assert result == "ok" and seconds < 0.5, (doc.get("name"), result, seconds)
