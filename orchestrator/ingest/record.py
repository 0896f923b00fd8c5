"""RunRecord: what the run engine knows about a run besides the artifact files, saved as results/<run-id>/
ingest.json before anything is parsed, so the database can always be rebuilt from disk (`tcplab ingest`).

It holds the run row as the engine left it (status, error, the flags only the run itself could raise: NIC
requests held by absence, task remarks), the plan row, flow rows, host evidence (hello, apply read-back, clock,
reset), the artifacts the agents announced and the capture point names.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INGEST_FILE = "ingest.json"


@dataclass
class RunRecord:
    run: dict[str, Any]
    plan: dict[str, Any] | None
    flows: list[dict[str, Any]]
    evidence: list[dict[str, Any]]
    artifacts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)   # host -> ArtifactInfo dicts
    points: dict[tuple[str, str], str] = field(default_factory=dict)          # (host, interface) -> label

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    @property
    def complete(self) -> bool:
        return self.run["status"] == "complete"

    def save(self, run_dir: Path) -> None:
        doc = {"run": self.run, "plan": self.plan, "flows": self.flows, "evidence": self.evidence,
               "artifacts": self.artifacts, "points": [[h, i, p] for (h, i), p in self.points.items()]}
        (run_dir / INGEST_FILE).write_text(json.dumps(doc, indent=1, default=_iso))

    @classmethod
    def load(cls, run_dir: Path) -> RunRecord:
        doc = json.loads((run_dir / INGEST_FILE).read_text())
        run = dict(doc["run"])
        for key in ("started_at", "finished_at"):
            if run.get(key):
                run[key] = dt.datetime.fromisoformat(run[key])
        plan = dict(doc["plan"]) if doc["plan"] else None
        if plan and plan.get("created_at"):
            plan["created_at"] = dt.datetime.fromisoformat(plan["created_at"])
        return cls(run=run, plan=plan, flows=doc["flows"], evidence=doc["evidence"], artifacts=doc["artifacts"],
                   points={(h, i): p for h, i, p in doc["points"]})


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
