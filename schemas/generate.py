"""Write the JSON Schema files under schemas/protocol/ from the pydantic models (the single source)."""
from __future__ import annotations

import json
from pathlib import Path

from schemas import protocol

PROTOCOL_DIR = Path(__file__).with_name("protocol")


def protocol_schemas() -> dict[str, dict]:
    """File name -> JSON Schema for every message and op argument/result type."""
    out: dict[str, dict] = {
        "request.schema.json": protocol.Request.model_json_schema(),
        "reply.schema.json": protocol.Reply.model_json_schema(),
        "event.schema.json": protocol.Event.model_json_schema(),
    }
    for op, model in protocol.OP_ARGS.items():
        out[f"{op}.args.schema.json"] = model.model_json_schema()
    for op, model in protocol.RESULTS.items():
        out[f"{op}.result.schema.json"] = model.model_json_schema()
    return out


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    PROTOCOL_DIR.mkdir(exist_ok=True)
    for name, schema in protocol_schemas().items():
        (PROTOCOL_DIR / name).write_text(render(schema))


if __name__ == "__main__":
    main()
