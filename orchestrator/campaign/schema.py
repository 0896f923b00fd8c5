"""schemas/campaign.schema.json, generated from the campaign model (`python -m orchestrator.campaign.schema`);
a unit test fails when the file and the model drift apart."""
from __future__ import annotations

from typing import Any

from orchestrator.campaign.model import Campaign
from orchestrator.plan.model.schema import SCHEMA_DIR, _schema, render

CAMPAIGN_SCHEMA_PATH = SCHEMA_DIR / "campaign.schema.json"


def campaign_schema() -> dict[str, Any]:
    return _schema(Campaign, CAMPAIGN_SCHEMA_PATH.name, "tcplab campaign")


def main() -> None:
    CAMPAIGN_SCHEMA_PATH.write_text(render(campaign_schema()), encoding="utf-8")
    print(f"wrote {CAMPAIGN_SCHEMA_PATH}")


if __name__ == "__main__":
    main()
