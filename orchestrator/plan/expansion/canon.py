"""Canonical form of instantiated plan values, for equality across spellings and for stable hashes.

`20mbit` and `20Mbit` are one value; a canonical form replaces each quantity by its kernel-unit number
and each model by its field dict, and the digest is a sha256 over sorted-key JSON of that form.
"""
from __future__ import annotations

import hashlib
import json
import math
from fractions import Fraction
from typing import Any

from pydantic import BaseModel

from orchestrator.plan.model.quantities import Quantity


def canonical(obj: Any) -> Any:
    """JSON-able form in kernel units; dict keys become strings so that sorting is total."""
    if isinstance(obj, Quantity):
        return {"$" + type(obj).__name__.lower(): canonical(obj.value)}
    if isinstance(obj, Fraction):   # relative thresholds ('0.17bdp') keep their exact ratio
        return f"{obj.numerator}/{obj.denominator}"
    if isinstance(obj, BaseModel):
        skip = getattr(type(obj), "HASH_SKIP_IF_DEFAULT", frozenset())
        return {name: canonical(getattr(obj, name)) for name, f in type(obj).model_fields.items()
                if not (name in skip and getattr(obj, name) == f.default)}
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)  # JSON has no NaN/inf; keep them distinguishable
    return obj


def canonical_json(obj: Any) -> str:
    return json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest(obj: Any, length: int = 10) -> str:
    """Short hex sha256 of the canonical form."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]
