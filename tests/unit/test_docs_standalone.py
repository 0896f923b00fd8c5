"""The repository stands alone: it points at no document outside itself, every guard code (G-…) and metric
code (M-…) it uses is defined in its own docs, and every link and docs reference in it resolves.

The files are those git tracks (`git ls-files`): build output, virtualenvs and results do not count.
CHANGELOG.md is held to the same rule as every other file. Its entries describe the repository to the same
reader, and none of them needs an outside document; the only history left out is git's own (old commits
are not files of the tree).
"""
from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# spelled in pieces so that this file does not contain what it looks for
OUTSIDE_DOCUMENTS = ("EXPERIMENTS" + ".md", "ARCHITECTURE" + ".md", "../" + "shared", "LAB-" + "NOTES")
CODE = re.compile(r"(?<![A-Za-z0-9_])([GM]-[A-Z0-9]+)\b")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
MD_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
# "docs/guards.md#g-netem", "experiments/README.md#ls-aimd", "playbooks/README.md" written in code and plans
DOC_REFERENCE = re.compile(r"(?<![\w-])((?:docs|experiments|playbooks)/[\w./-]*?\.md)(?:#([\w-]+))?")


@cache
def tracked() -> tuple[str, ...]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return tuple(p for p in out.decode().split("\0") if p)


@cache
def text_of(path: str) -> str | None:
    """The file's text, or None for a binary file (or one deleted from the work tree)."""
    try:
        raw = (ROOT / path).read_bytes()
    except OSError:
        return None
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def texts() -> dict[str, str]:
    return {p: t for p in tracked() if (t := text_of(p)) is not None}


def slug(title: str) -> str:
    """The anchor a heading gets on GitHub: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    out: set[str] = set()
    for _, title in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(title)
        name, n = base, 0
        while name in out:   # repeated headings get -1, -2, ...
            n += 1
            name = f"{base}-{n}"
        out.add(name)
    return out


@cache
def page_anchors(page: str) -> set[str]:
    return anchors((ROOT / page).read_text())


def defined_codes(doc: str) -> set[str]:
    return {title for _, title in HEADING.findall(FENCE.sub("", (ROOT / doc).read_text()))
            if CODE.fullmatch(title)}


def test_no_tracked_file_points_outside_the_repository():
    hits = [f"{path}:{n}: {line.strip()}" for path, text in texts().items()
            for n, line in enumerate(text.splitlines(), 1) if any(d in line for d in OUTSIDE_DOCUMENTS)]
    assert not hits, "references to documents outside the repository:\n" + "\n".join(hits)


def test_every_guard_and_metric_code_is_defined_in_the_docs():
    used: dict[str, str] = {}
    for path, text in texts().items():
        for code in CODE.findall(text):
            used.setdefault(code, path)
    guards, metrics = defined_codes("docs/guards.md"), defined_codes("docs/metrics.md")
    assert {c for c in used if c.startswith("G-")} >= {"G-NETEM", "G-CPULOAD", "G-ECN"}   # the scan sees them
    missing = sorted(f"{code} (used in {path})" for code, path in used.items()
                     if code not in (guards if code.startswith("G-") else metrics))
    assert not missing, ("codes without a heading in docs/guards.md (G-…) or docs/metrics.md (M-…):\n"
                         + "\n".join(missing))


def test_every_defined_code_is_used_somewhere_else():
    """A heading for a code nothing else mentions is a definition of nothing (or a misspelt code)."""
    docs = {"docs/guards.md", "docs/metrics.md"}
    used = {c for path, text in texts().items() if path not in docs for c in CODE.findall(text)}
    unused = sorted((defined_codes("docs/guards.md") | defined_codes("docs/metrics.md")) - used)
    assert not unused, f"defined in the docs but used nowhere else: {unused}"


def _target_problem(source: str, target: str) -> str | None:
    """Why a link from the tracked file `source` to `target` (path#anchor) does not resolve, or None."""
    path_part, _, anchor = target.partition("#")
    if path_part:
        resolved = (ROOT / source).parent.joinpath(path_part).resolve()
        try:
            rel = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            return "points outside the repository"
        files = set(tracked())
        if rel not in files and not any(f.startswith(rel.rstrip("/") + "/") for f in files):
            return "no such tracked file or directory"
    else:
        rel = source
    if anchor and rel.endswith(".md") and anchor not in page_anchors(rel):
        return f"{rel} has no heading #{anchor}"
    return None


def test_relative_links_in_markdown_resolve():
    problems = []
    for path in (p for p in tracked() if p.endswith(".md")):
        text = INLINE_CODE.sub("", FENCE.sub("", text_of(path) or ""))
        for target in MD_LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto: ...
                continue
            if (why := _target_problem(path, target)) is not None:
                problems.append(f"{path}: ({target}): {why}")
    assert not problems, "\n".join(problems)


def test_docs_references_in_code_plans_and_tests_resolve():
    """`docs/guards.md#g-netem` in a comment, a docstring or an error message names a real page and heading."""
    problems = []
    for path, text in texts().items():
        for page, anchor in DOC_REFERENCE.findall(text):
            if page not in tracked():
                problems.append(f"{path}: {page}: no such tracked file")
            elif anchor and anchor not in page_anchors(page):
                problems.append(f"{path}: {page}#{anchor}: no such heading")
    assert not problems, "\n".join(problems)


def test_the_scans_catch_what_they_look_for():
    """The helpers above find a broken link, an undefined code and a foreign reference when there is one."""
    assert slug("G-NETEM") == "g-netem" and slug("Timer-based CC") == "timer-based-cc"
    assert slug("The `mark` qdisc (DCTCP flaws)") == "the-mark-qdisc-dctcp-flaws"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
    assert CODE.findall("G-HTB-conform, SG-X, (M-QDELAY (b)), G-NETEM.") == ["G-HTB", "M-QDELAY", "G-NETEM"]
    assert _target_problem("docs/README.md", "guards.md#g-netem") is None
    assert _target_problem("docs/README.md", "guards.md#g-nothing") == "docs/guards.md has no heading #g-nothing"
    assert _target_problem("docs/README.md", "nothing.md") == "no such tracked file or directory"
    assert _target_problem("docs/README.md", "../../outside.md") == "points outside the repository"
    assert DOC_REFERENCE.findall("see docs/guards.md#g-netem and ../docs/metrics.md.") == [
        ("docs/guards.md", "g-netem"), ("docs/metrics.md", "")]
