"""Paths into plan documents: key paths (tuples of keys and list indices) and dotted field paths, which
are parsed by type rather than by string splitting.

`hosts.all.sysctls.net.ipv4.tcp_ecn` walks RunTemplate -> hosts (a map of models: one segment is the
key) -> HostSection -> sysctls (a map of plain values: the rest of the path is the key). The result is
the canonical key path (`('hosts', 'all', 'sysctls', 'net.ipv4.tcp_ecn')`) and the annotation a value at
that path must satisfy, so axis values are validated as the field they set.
"""
from __future__ import annotations

import copy
import difflib
import functools
import operator
import types
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Field

KeyPath = tuple[str | int, ...]
"""Where a value sits in a document: mapping keys and list indices from the root, e.g.
`('matrix', 'axes', 'bottleneck.rate', 1)`."""




class PathError(ValueError):
    """A dotted path that names no field of the run template."""


@dataclass(frozen=True)
class Target:
    path: KeyPath
    annotation: Any   # None when the field's type depends on a choice (e.g. the queue kind)


def unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional wrappers to reach the structural type."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return functools.reduce(operator.or_, args) if len(args) > 1 else tp
            tp = args[0]
        else:
            return tp


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _field_annotation(model: type[BaseModel], name: str) -> Any:
    info = model.model_fields[name]
    meta = list(info.metadata)
    if info.discriminator is not None:  # pydantic keeps it on the FieldInfo, not in the metadata
        meta.append(Field(discriminator=info.discriminator))
    return Annotated[(info.annotation, *meta)] if meta else info.annotation


def _is_container(tp: Any) -> bool:
    base = unwrap(tp)
    return is_model(base) or get_origin(base) in (dict, list, Union, types.UnionType)


def _where(done: KeyPath) -> str:
    return ".".join(str(s) for s in done) or "the run template"


def _unknown(seg: str, known: list[str], done: KeyPath) -> PathError:
    close = difflib.get_close_matches(seg, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (fields: {', '.join(known)})"
    return PathError(f"{_where(done)} has no field {seg!r}{hint}")


def _walk(tp: Any, segs: list[str], done: KeyPath) -> Target:
    if not segs:
        return Target(done, tp)
    base, seg = unwrap(tp), segs[0]
    if is_model(base):
        if seg not in base.model_fields:
            raise _unknown(seg, list(base.model_fields), done)
        return _walk(_field_annotation(base, seg), segs[1:], done + (seg,))
    origin = get_origin(base)
    if origin is dict:
        key_type, value_type = get_args(base)
        # A map of models takes one segment as its key; a map of plain values takes the rest
        # (sysctl names contain dots).
        key_text, rest = (seg, segs[1:]) if _is_container(value_type) else (".".join(segs), [])
        key: str | int = key_text
        if unwrap(key_type) is int:
            if not key_text.isdigit():
                raise PathError(f"{_where(done)} is keyed by integers, not {key_text!r}")
            key = int(key_text)
        return _walk(value_type, rest, done + (key,))
    if origin is list:
        if not seg.isdigit():
            raise PathError(f"{_where(done)} is a list; index it with a number, not {seg!r}")
        return _walk(get_args(base)[0], segs[1:], done + (int(seg),))
    if origin in (Union, types.UnionType):
        members = [m for m in get_args(base) if is_model(m) and seg in m.model_fields]
        if not members:
            fields = sorted({f for m in get_args(base) if is_model(m) for f in m.model_fields})
            raise _unknown(seg, fields, done)
        target = _walk(_field_annotation(members[0], seg), segs[1:], done + (seg,))
        same = all(repr(_field_annotation(m, seg)) == repr(_field_annotation(members[0], seg))
                   for m in members)
        # Different kinds type the same name differently (pfifo limit = packets, bfifo limit = bytes):
        # the value is then checked only when the whole run is validated.
        return target if same else Target(target.path, None)
    raise PathError(f"{_where(done)} is a single value; it has no field {seg!r}")


def parse_field_path(root: type[BaseModel], dotted: str) -> Target:
    """Canonical path and value type of `dotted` inside `root`; raise PathError if there is none."""
    segs = dotted.split(".")
    if not dotted or any(not s for s in segs):
        raise PathError(f"empty segment in the field path {dotted!r}")
    return _walk(root, segs, ())


def set_in(doc: Any, path: KeyPath, value: Any) -> Any:
    """Copy of the raw document `doc` with `value` at `path`; missing or null maps on the way are created."""
    if not path:
        return copy.deepcopy(value)
    head, rest = path[0], path[1:]
    if isinstance(head, int) and isinstance(doc, list):
        if head >= len(doc):
            raise PathError(f"index {head} is beyond the {len(doc)} items of the list")
        out_list = list(doc)
        out_list[head] = set_in(doc[head], rest, value)
        return out_list
    out = dict(doc) if isinstance(doc, dict) else {}
    out[head] = set_in(out.get(head), rest, value)
    return out


def get_in(obj: Any, path: KeyPath) -> Any:
    """Value at `path` in a model tree or raw document; raise KeyError if absent."""
    for seg in path:
        if isinstance(obj, BaseModel):
            if not isinstance(seg, str) or not hasattr(obj, seg):
                raise KeyError(seg)
            obj = getattr(obj, seg)
        elif isinstance(obj, dict):
            obj = obj[seg]
        elif isinstance(obj, list) and isinstance(seg, int) and seg < len(obj):
            obj = obj[seg]
        else:
            raise KeyError(seg)
    return obj
