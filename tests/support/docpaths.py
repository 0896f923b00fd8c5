"""Every key path in a parsed plan document (mappings and lists), for tests that mutate one value at a time."""
from __future__ import annotations

from typing import Any


def key_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of `doc` itself, then of every value below it, depth first."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += key_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += key_paths(v, prefix + (i,))
    return out
