"""Plan errors as values: every problem is an `Issue` with a file, line, column and field path.

Validation collects issues from every pass and raises one `PlanError` holding all of them, so a
researcher sees every mistake at once as `FILE:LINE:COL: field.path: message` lines.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.plan.model.paths import KeyPath


def printable(text: str) -> str:
    """`text` on one printable line: newlines, NULs, lone surrogates and other unprintable characters are
    written as escapes, so an issue is always one `FILE:LINE:COL: field: message` line any terminal shows."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def format_path(path: KeyPath) -> str:
    """`('matrix', 'axes', 'bottleneck.rate', 1)` -> `matrix.axes['bottleneck.rate'][1]`."""
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        elif "." in seg or " " in seg or not seg or not seg.isprintable():
            out += f"[{seg!r}]"
        else:
            out += f".{seg}" if out else seg
    return out or "(plan)"


@dataclass(frozen=True, order=True)
class Issue:
    """One located problem. `line` and `col` are 1-based."""

    file: str
    line: int
    col: int
    path: KeyPath
    message: str

    def __str__(self) -> str:
        return printable(f"{self.file}:{self.line}:{self.col}: {format_path(self.path)}: {self.message}")


@dataclass(frozen=True)
class Problem:
    """An unlocated problem found by a check: a path into the plan document and a message.

    `at_key` asks for the position of the mapping key rather than its value (unknown fields).
    """

    path: KeyPath
    message: str
    at_key: bool = False


class PlanError(Exception):
    """Raised by the plan loader with every issue found, sorted by position."""

    def __init__(self, issues: Iterable[Issue]):
        self.issues: list[Issue] = sorted(set(issues), key=lambda i: (i.file, i.line, i.col, i.message))
        super().__init__("\n".join(str(i) for i in self.issues) or "invalid plan")


Mark = tuple[int, int]


@dataclass(frozen=True)
class Marks:
    """1-based positions of the nodes of a YAML document, by path (values) and by mapping key."""

    values: Mapping[KeyPath, Mark]
    keys: Mapping[KeyPath, Mark]

    def locate(self, path: KeyPath, at_key: bool = False) -> Mark:
        """Position of `path`, falling back to the nearest parent that exists in the document."""
        for n in range(len(path), -1, -1):
            prefix = path[:n]
            if at_key and n == len(path) and prefix in self.keys:
                return self.keys[prefix]
            if prefix in self.values:
                return self.values[prefix]
        return (1, 1)


def locate_all(problems: Iterable[Problem], marks: Marks, file: str) -> list[Issue]:
    out = []
    for p in problems:
        line, col = marks.locate(p.path, p.at_key)
        out.append(Issue(file, line, col, p.path, p.message))
    return out
