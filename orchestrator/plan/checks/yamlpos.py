"""YAML reading that keeps the line and column of every node, so errors can point at the plan text.

The bounded YAML 1.2 loader (yamlcore.py) gives a node tree with start marks; this module turns it into
plain Python values (dict/list/str/int/float/bool/None) plus a `Marks` table keyed by path. It also refuses
what plain `yaml.safe_load` silently accepts: duplicate keys, recursive aliases and alias bombs (aliases
are expanded here, so the node bound applies again to the expanded tree).
"""
from __future__ import annotations

import datetime
from typing import Any

import yaml

from orchestrator.plan.checks.errors import Issue, Mark, Marks, PlanError
from orchestrator.plan.checks.yamlcore import PlanLoader, unprintable_at
from orchestrator.plan.model.bounds import MAX_DEPTH, MAX_NODES
from orchestrator.plan.model.paths import KeyPath

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Reader:
    def __init__(self, loader: PlanLoader, file: str):
        self.loader, self.file = loader, file
        self.values: dict[KeyPath, Mark] = {}
        self.keys: dict[KeyPath, Mark] = {}
        self.issues: list[Issue] = []
        self.count = 0
        self.stack: set[int] = set()

    def issue(self, node: yaml.Node, path: KeyPath, message: str) -> None:
        line, col = _mark(node)
        self.issues.append(Issue(self.file, line, col, path, message))

    def convert(self, node: yaml.Node, path: KeyPath) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise PlanError([Issue(self.file, *_mark(node), path, f"plan too large (over {MAX_NODES} nodes)")])
        self.values.setdefault(path, _mark(node))
        if len(path) > MAX_DEPTH:
            self.issue(node, path, f"nested more than {MAX_DEPTH} levels deep")
            return None
        if id(node) in self.stack:
            self.issue(node, path, "recursive YAML alias")
            return None
        self.stack.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                return [self.convert(item, path + (i,)) for i, item in enumerate(node.value)]
            return self._scalar(node, path)
        finally:
            self.stack.discard(id(node))

    def _scalar(self, node: yaml.Node, path: KeyPath) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:   # the position is the node's; keep the message to one line
            self.issue(node, path, f"cannot read this YAML value: {exc.problem or exc.context}")
            return None
        except yaml.YAMLError as exc:
            self.issue(node, path, f"cannot read this YAML value: {exc}")
            return None
        if isinstance(value, (datetime.date, datetime.datetime)):
            self.issue(node, path, "YAML read this as a date; quote it if it is text")
            return str(value)
        if not isinstance(value, (str, int, float, bool, type(None))):
            self.issue(node, path, f"unsupported YAML value of type {type(value).__name__}")
            return None
        return value

    def _key(self, node: yaml.Node, path: KeyPath) -> str | int | None:
        if not isinstance(node, yaml.ScalarNode):
            self.issue(node, path, "a mapping key must be a plain string or integer")
            return None
        key = self._scalar(node, path)
        if isinstance(key, bool):
            self.issue(node, path, f"the key {node.value!r} reads as a YAML boolean; quote it")
            return None
        if isinstance(key, str) or isinstance(key, int):
            return key
        self.issue(node, path, f"a mapping key must be a string or integer, not {node.value!r}")
        return None

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str | int, Any]:
        out: dict[str | int, Any] = {}
        merged: dict[str | int, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.update(self._merge(value_node, path))
                continue
            key = self._key(key_node, path)
            if key is None:
                continue
            if key in out:
                self.issue(key_node, path + (key,), f"duplicate key {key!r} (first at line "
                           f"{self.keys[path + (key,)][0]})")
                continue
            self.keys[path + (key,)] = _mark(key_node)
            out[key] = self.convert(value_node, path + (key,))
        return {**merged, **out}

    def _merge(self, node: yaml.Node, path: KeyPath) -> dict[str | int, Any]:
        """`<<: *anchor` (or a list of anchors): keys of the merged maps, earlier maps win."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        out: dict[str | int, Any] = {}
        for src in reversed(sources):
            if not isinstance(src, yaml.MappingNode):
                self.issue(src, path, "'<<' merges only mappings")
                continue
            out.update(self._mapping(src, path))
        return out


def _mark(node: yaml.Node) -> Mark:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def read_yaml(text: str, file: str) -> tuple[Any, Marks]:
    """Parse one YAML document into plain values and their positions; raise PlanError on any problem."""
    bad = unprintable_at(text)
    if bad is not None:
        line = text.count("\n", 0, bad) + 1
        col = bad - (text.rfind("\n", 0, bad) + 1) + 1
        raise PlanError([Issue(file, line, col, (), f"character U+{ord(text[bad]):04X} is not allowed in YAML")])
    loader = PlanLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        kind = "YAML" if isinstance(exc, yaml.composer.ComposerError) else "YAML syntax"
        if "maximum nesting depth" in problem:   # PyYAML >= 6.0.3's scanner stops deep flow nesting first
            kind, problem = "YAML", f"nested more than {MAX_DEPTH} levels deep"
        raise PlanError([Issue(file, line, col, (), f"{kind}: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise PlanError([Issue(file, 1, 1, (), f"YAML: {exc}")]) from None
    except RecursionError:
        raise PlanError([Issue(file, 1, 1, (), "YAML nested too deeply")]) from None
    finally:
        loader.dispose()
    if node is None:
        raise PlanError([Issue(file, 1, 1, (), "the plan file is empty")])
    reader = _Reader(loader, file)
    doc = reader.convert(node, ())
    if reader.issues:
        raise PlanError(reader.issues)
    return doc, Marks(reader.values, reader.keys)
