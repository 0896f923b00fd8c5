"""Boundary validation of protocol messages against the checked-in JSON Schema files.

Both the agent and the manager call `check_request`/`check_reply`; failures become `ProtocolError`
carrying the op and the field path, which the agent turns into a coded error reply.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

PROTOCOL_DIR = Path(__file__).with_name("protocol")


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, op: str | None = None, field: str | None = None):
        self.code, self.op, self.field = code, op, field
        where = " ".join(p for p in (f"op={op}" if op else "", f"field={field}" if field else "") if p)
        super().__init__(f"{message} ({where})" if where else message)
        self.detail = message


@cache
def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((PROTOCOL_DIR / f"{name}.schema.json").read_text())
    return Draft202012Validator(schema)


def _first_error(name: str, doc: Any) -> tuple[str, str] | None:
    errors = sorted(_validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    err = errors[0]
    path = ".".join(str(p) for p in err.absolute_path)
    return path, err.message


def check(name: str, doc: Any, op: str | None = None, code: str = "invalid_args") -> None:
    """Raise ProtocolError naming op and field if `doc` does not satisfy schema `name`."""
    found = _first_error(name, doc)
    if found:
        path, message = found
        raise ProtocolError(code, message, op=op, field=path or None)


def check_request(doc: Any) -> None:
    check("request", doc, op=doc.get("op") if isinstance(doc, dict) else None, code="bad_request")
    check(f"{doc['op']}.args", doc.get("args", {}), op=doc["op"])


def check_result(op: str, result: Any) -> None:
    check(f"{op}.result", result, op=op, code="protocol")
