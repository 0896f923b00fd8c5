"""The YAML reader a plan is parsed with: YAML 1.2 core-schema resolution, bounded while it parses.

PyYAML's `SafeLoader` resolves plain scalars by YAML 1.1 rules: `1:30:00` is 5400 (base 60), `010` is 8
(octal), `off`/`yes`/`on` are booleans, `2024-01-01` a date. A plan means what it shows, so this loader
resolves by the YAML 1.2 core schema instead: only `true`/`false` are booleans, only `null`/`~`/empty is
null, integers are decimal (or `0o`/`0x`), and everything else is a string that the plan's field types
read (a bool field still takes `off`, a time field refuses `1:30:00` with a message). A decimal integer
with a leading zero (`010`) is refused: other YAML readers take it as octal.

Bounds are applied during parsing, before any value is built, so a hostile file costs well under a second:
  - nodes (scalars, sequences, mappings, aliases) composed: `MAX_NODES`;
  - nesting depth: `MAX_DEPTH` (also keeps the recursive composer far from Python's recursion limit);
  - numbers: at most `MAX_NUMBER_CHARS` characters, finite (`.inf`/`.nan` are refused): Python's int()
    refuses over 4,300 digits and float('1e999') is infinite.
Alias expansion (an alias bomb) is bounded where the tree is converted (yamlpos.py).
"""
from __future__ import annotations

import math
import re

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from orchestrator.plan.model.bounds import MAX_DEPTH, MAX_NODES, MAX_NUMBER_CHARS

_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                    r"|\.(?:nan|NaN|NAN))$")
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9]+$")


class CoreResolver(yaml.resolver.BaseResolver):
    """Implicit tags of the YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1023-core-schema)."""


CoreResolver.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
CoreResolver.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"),
                                   ["~", "n", "N", ""])
CoreResolver.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
CoreResolver.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))
CoreResolver.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^<<$"), ["<"])


class CoreConstructor(yaml.constructor.SafeConstructor):
    """Numbers by the core schema, bounded in size and finite; the other safe types as PyYAML builds them."""

    def _number_text(self, node: yaml.Node) -> str:
        text = str(self.construct_scalar(node))
        if len(text) > MAX_NUMBER_CHARS:
            raise ConstructorError(None, None, f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})",
                                   node.start_mark)
        return text

    def construct_core_int(self, node: yaml.Node) -> int:
        text = self._number_text(node)
        if _LEADING_ZERO.match(text):
            raise ConstructorError(None, None, f"{text} has a leading zero, which YAML 1.1 readers take as octal; "
                                   "write it without the zero, or quote it if it is text", node.start_mark)
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        if not _INT.match(text):   # an explicit !!int tag on something else
            raise ConstructorError(None, None, f"cannot read {text!r} as an integer", node.start_mark)
        return int(text)

    def construct_core_float(self, node: yaml.Node) -> float:
        text = self._number_text(node)
        if not _FLOAT.match(text):
            raise ConstructorError(None, None, f"cannot read {text!r} as a number", node.start_mark)
        if text.lower().endswith((".inf", ".nan")) or not math.isfinite(value := float(text)):
            raise ConstructorError(None, None, f"{text} is not a finite number", node.start_mark)
        if value == 0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]):
            raise ConstructorError(None, None, f"{text} is too small to be told from 0", node.start_mark)
        return value

    def construct_core_bool(self, node: yaml.Node) -> bool:
        text = str(self.construct_scalar(node)).lower()
        if text not in ("true", "false"):
            raise ConstructorError(None, None, f"cannot read {text[:40]!r} as a boolean", node.start_mark)
        return text == "true"


CoreConstructor.add_constructor("tag:yaml.org,2002:int", CoreConstructor.construct_core_int)
CoreConstructor.add_constructor("tag:yaml.org,2002:float", CoreConstructor.construct_core_float)
CoreConstructor.add_constructor("tag:yaml.org,2002:bool", CoreConstructor.construct_core_bool)


class BoundedComposer(yaml.composer.Composer):
    """PyYAML's composer, counting nodes and depth as it builds the tree and stopping at the bounds."""

    nodes_composed = 0
    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        self.nodes_composed += 1
        if self.nodes_composed > MAX_NODES:
            raise ComposerError(None, None, f"the plan is too large (more than {MAX_NODES} YAML nodes)",
                                self.peek_event().start_mark)
        if self.depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def unprintable_at(text: str) -> int | None:
    """Index of the first character YAML does not allow in a stream (checked before parsing, so the error
    can point at its line and column whichever parser reads the text)."""
    m = yaml.reader.Reader.NON_PRINTABLE.search(text)
    return m.start() if m else None


if yaml.__with_libyaml__:
    class PlanLoader(BoundedComposer, CoreConstructor, CoreResolver, yaml.cyaml.CParser):
        """libyaml's scanner and parser (4x faster than PyYAML's: a megabyte of YAML is refused in half a
        second), feeding PyYAML's composer with the bounds, the core-schema resolver and bounded numbers."""

        def __init__(self, stream: str) -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            BoundedComposer.__init__(self)
            CoreConstructor.__init__(self)
            CoreResolver.__init__(self)
else:  # pragma: no cover - PyYAML built without libyaml
    class PlanLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,  # type: ignore[no-redef]
                     BoundedComposer, CoreConstructor, CoreResolver):
        """SafeLoader's pipeline with the bounded composer, the core-schema resolver and bounded numbers."""

        def __init__(self, stream: str) -> None:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            BoundedComposer.__init__(self)
            CoreConstructor.__init__(self)
            CoreResolver.__init__(self)
