"""schemas/plan.schema.json is generated from the plan model, documents every field, and accepts the plans."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from orchestrator.plan.model.schema import PROFILE_SCHEMA_PATH, SCHEMA_PATH, plan_schema, profile_schema, render
from tests.support.shipped import PROFILES

ROOT = Path(__file__).resolve().parents[2]
GOOD_PLANS = [ROOT / "experiments" / "quickstart.yaml", *sorted((ROOT / "tests" / "plans").glob("good_*.yaml"))]


def test_schema_file_matches_the_model() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == render(plan_schema()), (
        "schemas/plan.schema.json is stale: run `python -m orchestrator.plan.model.schema`")
    assert PROFILE_SCHEMA_PATH.read_text(encoding="utf-8") == render(profile_schema()), (
        "schemas/profile.schema.json is stale: run `python -m orchestrator.plan.model.schema`")


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_profile_schema_documents_every_field_and_accepts_the_shipped_profiles(profile: Path) -> None:
    schema = json.loads(PROFILE_SCHEMA_PATH.read_text(encoding="utf-8"))
    for name, prop in _properties(schema):
        assert prop.get("description") and prop.get("examples"), name
    errors = [e.message for e in Draft202012Validator(schema).iter_errors(yaml.safe_load(profile.read_text()))]
    assert errors == []


def _properties(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from (("Plan." + k, v) for k, v in schema["properties"].items())
    for model, sub in schema["$defs"].items():
        yield from ((f"{model}.{k}", v) for k, v in sub.get("properties", {}).items())


def test_every_field_has_description_and_example() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    props = list(_properties(schema))
    assert len(props) > 50
    for name, prop in props:
        assert prop.get("description"), f"{name} has no description"
        assert prop.get("examples"), f"{name} has no example"


def test_quantity_fields_name_their_unit() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    props = dict(_properties(schema))
    assert "bit/s" in props["Bottleneck.rate"]["unit"]
    assert "time" in props["RunTemplate.duration"]["unit"]
    assert "bytes" in props["BfifoQueue.limit"]["unit"]
    assert props["PfifoQueue.limit"]["unit"] == "packets"


@pytest.mark.parametrize("plan", GOOD_PLANS, ids=lambda p: p.name)
def test_schema_accepts_good_plans(plan: Path) -> None:
    validator = Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(plan.read_text()))]
    assert errors == []


def test_schema_rejects_unknown_fields() -> None:
    validator = Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    doc = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    doc["run"]["traffic"]["flowz"] = 2
    assert not validator.is_valid(doc)
