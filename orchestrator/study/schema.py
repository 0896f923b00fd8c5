"""schemas/study.schema.json, generated from the study model (`python -m orchestrator.study.schema`); a unit test
fails when the file and the model drift apart."""
from __future__ import annotations

from typing import Any

from orchestrator.plan.model.schema import SCHEMA_DIR, _schema, render
from orchestrator.study.model import Study

STUDY_SCHEMA_PATH = SCHEMA_DIR / "study.schema.json"


def study_schema() -> dict[str, Any]:
    return _schema(Study, STUDY_SCHEMA_PATH.name, "tcplab study")


def main() -> None:
    STUDY_SCHEMA_PATH.write_text(render(study_schema()), encoding="utf-8")
    print(f"wrote {STUDY_SCHEMA_PATH}")


if __name__ == "__main__":
    main()
