"""Event records (agents/events.py `event-<index>.json`) -> run_event rows (pure). docs/ingest.md.

`effective_ns` is when the change command returned: the kernel applies a `tc ... change` before it
acknowledges it, so the new setting is in force from then on; `lag_ns` = effective - scheduled is what the
run's event actually trailed its plan time by (woken late by the agent's loop, plus tc's own time).
"""
from __future__ import annotations

import json
from typing import Any

ACTIONS = ("ack_blackout", "set_delay", "set_loss", "set_rate", "stop_flows")


def _ns(doc: dict, *path: str) -> int | None:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    if doc is None:
        return None
    if not isinstance(doc, int) or isinstance(doc, bool) or doc < 0:
        raise ValueError(f"{'.'.join(path)}: expected a non-negative integer of ns, got {doc!r}")
    return doc


def event_lag_ns(scheduled_ns: int, effective_ns: int | None) -> int | None:
    return None if effective_ns is None else effective_ns - scheduled_ns


def parse_event_record(text: str, host: str) -> dict[str, Any]:
    """One run_event row (without run_id) from an event record."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    if doc.get("action") not in ACTIONS:
        raise ValueError(f"action: {doc.get('action')!r} is not one of {', '.join(ACTIONS)}")
    index, scheduled = doc.get("index"), _ns(doc, "scheduled_ns")
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"index: expected a non-negative integer, got {index!r}")
    if scheduled is None:
        raise ValueError("scheduled_ns: missing")
    effective = _ns(doc, "start", "returned_ns")
    detail = {k: v for k, v in doc.items() if k not in ("index", "action", "interface", "scheduled_ns")}
    return {"event_index": index, "action": doc["action"], "host": host, "interface": doc.get("interface"),
            "scheduled_ns": scheduled, "issued_ns": _ns(doc, "start", "issued_ns"), "effective_ns": effective,
            "lag_ns": event_lag_ns(scheduled, effective), "end_scheduled_ns": _ns(doc, "end_scheduled_ns"),
            "end_effective_ns": _ns(doc, "end", "returned_ns"), "detail": detail}
