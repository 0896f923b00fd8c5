"""Saved queries: definitions and parameter binding (pure)."""
from __future__ import annotations

import re

import pytest

from orchestrator.storage import saved_queries as sq


def test_required_queries_exist_with_descriptions() -> None:
    assert {"runs", "qdelay-by-variant", "latecomer-fairness", "campaign-verdicts"} <= set(sq.QUERIES)
    for q in sq.QUERIES.values():
        assert q.description and all(p.help and p.type in (int, float, str) for p in q.params)


def test_every_placeholder_is_a_declared_parameter_and_nothing_is_formatted() -> None:
    for q in sq.QUERIES.values():
        used = set(re.findall(r"(?<!:):([a-z_]+)", q.sql))
        assert used == {p.name for p in q.params}, q.name
        assert "{" not in q.sql and "%" not in q.sql


def test_bind_converts_types_and_fills_defaults() -> None:
    q = sq.saved_query("runs")
    assert sq.bind(q, {"limit": "5"}) == {"plan": None, "status": None, "limit": 5}
    with pytest.raises(sq.SavedQueryError, match=r"--param limit='5\.5': query runs wants an integer"):
        sq.bind(q, {"limit": "5.5"})


def test_parse_assignments() -> None:
    assert sq.parse_assignments(["a=1", "b=x=y", "a=2"]) == {"a": "2", "b": "x=y"}
    with pytest.raises(sq.SavedQueryError, match="--param '=1'"):
        sq.parse_assignments(["=1"])
