"""The plan JSON Schema, generated from the pydantic plan model (the single source).

`python -m orchestrator.plan.model.schema` writes `schemas/plan.schema.json`; a unit test fails if the file
and the model drift apart. Every field carries a description and an example, and quantities their unit.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.plan.model.plan import Plan

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "schemas" / "plan.schema.json"
SCHEMA_ID = "https://tcplab.invalid/schemas/plan.schema.json"


def plan_schema() -> dict[str, Any]:
    schema = Plan.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "tcplab plan", **{k: v for k, v in schema.items() if k != "title"}}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    SCHEMA_PATH.write_text(render(plan_schema()), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")


if __name__ == "__main__":
    main()
