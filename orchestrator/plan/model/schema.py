"""The plan and testbed-profile JSON Schemas, generated from their pydantic models (the single source).

`python -m orchestrator.plan.model.schema` writes `schemas/plan.schema.json` and
`schemas/profile.schema.json`; a unit test fails if a file and its model drift apart. Every field carries a
description and an example, and quantities their unit.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator.plan.model.plan import Plan
from orchestrator.plan.model.profile import Profile

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "schemas"
SCHEMA_PATH = SCHEMA_DIR / "plan.schema.json"
PROFILE_SCHEMA_PATH = SCHEMA_DIR / "profile.schema.json"
SCHEMA_ID = "https://tcplab.invalid/schemas/plan.schema.json"


def _schema(model: type[BaseModel], name: str, title: str) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://tcplab.invalid/schemas/{name}", "title": title,
            **{k: v for k, v in schema.items() if k != "title"}}


def plan_schema() -> dict[str, Any]:
    return _schema(Plan, SCHEMA_PATH.name, "tcplab plan")


def profile_schema() -> dict[str, Any]:
    return _schema(Profile, PROFILE_SCHEMA_PATH.name, "tcplab testbed profile")


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    for path, schema in ((SCHEMA_PATH, plan_schema()), (PROFILE_SCHEMA_PATH, profile_schema())):
        path.write_text(render(schema), encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
