"""Turn pydantic validation errors into plan problems: a path into the YAML document and a clear message.

pydantic's `loc` contains union tags (`pfifo`, `function-after[...]`) and `[key]` markers that are not in
the document; they are dropped here so the path (and so the line/column) names what the researcher wrote.
"""
from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from orchestrator.plan.checks.errors import Problem
from orchestrator.plan.model.paths import KeyPath, PathError, is_model, parse_field_path, unwrap


def _normalize(doc: Any, loc: tuple[Any, ...]) -> tuple[KeyPath, bool]:
    """Map a pydantic loc onto the document: (path, the error is about a mapping key)."""
    out: list[str | int] = []
    node, at_key, i = doc, False, 0
    while i < len(loc):
        seg = loc[i]
        if seg == "[key]":
            at_key = True
        elif isinstance(node, dict):
            if seg in node:
                out.append(seg)
                node = node[seg]
            elif seg == node.get("kind") or (i + 1 < len(loc) and loc[i + 1] in node):
                pass  # a union tag: pydantic names the member it tried, the document does not
            else:
                out.extend(s for s in loc[i:] if s != "[key]")  # a missing or unknown key
                break
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            out.append(seg)
            node = node[seg]
        else:
            break  # the rest are union tags under a scalar
        i += 1
    return tuple(out), at_key


def _known_fields(root: Any, parent: KeyPath) -> list[str]:
    """Field names allowed at `parent` (for did-you-mean hints); [] when they cannot be told."""
    tp: Any = root
    if parent:
        if not is_model(root):
            return []
        try:
            tp = parse_field_path(root, ".".join(str(s) for s in parent)).annotation
        except PathError:
            return []
    base = unwrap(tp)
    if is_model(base):
        return list(base.model_fields)
    args = getattr(base, "__args__", ())
    return sorted({f for m in args if is_model(m) for f in m.model_fields})


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(err: ErrorDetails, path: KeyPath, root: Any, model_path: KeyPath) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        name = str(path[-1]) if path else "?"
        close = difflib.get_close_matches(name, _known_fields(root, model_path), n=1)
        return f"unknown field {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")
    if kind in ("value_error", "assertion_error"):
        return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return f"unknown kind {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "missing `kind`, which says what this is"
    value = err.get("input")
    if kind == "literal_error":
        expected = str(err.get("ctx", {}).get("expected", ""))
        options = [o.strip(" '") for o in expected.replace(" or ", ", ").split(",")]
        close = difflib.get_close_matches(str(value), options, n=1) if isinstance(value, str) else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{_short(value)} is not one of {expected}{hint}"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return f"{msg}; got {_short(value)}"
    if isinstance(value, (dict, list)):
        return f"{msg}; got a {'mapping' if isinstance(value, dict) else 'list'}"
    return msg


def problems_from(exc: ValidationError, doc: Any, root: Any) -> list[Problem]:
    """One problem per pydantic error, located in `doc` (the data validated against the type `root`)."""
    out = []
    for err in exc.errors():
        path, at_key = _normalize(doc, tuple(err["loc"]))
        at_key = at_key or err["type"] == "extra_forbidden"
        model_path = path[:-1] if err["type"] == "extra_forbidden" else path
        out.append(Problem(path, _message(err, path, root, model_path), at_key))
    return out
