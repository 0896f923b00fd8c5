"""Load a plan file: read YAML with positions, run every validation pass, raise one PlanError with all issues.

This is where a plan is checked, once: `load_plan` / `load_plan_text` for plan files, `check_plan` for a
plan built in Python. The only module of the plan package that touches the filesystem.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from orchestrator.plan.checks.errors import Issue, Marks, PlanError, locate_all
from orchestrator.plan.checks.passes import check_document
from orchestrator.plan.checks.yamlpos import read_yaml
from orchestrator.plan.model.bounds import MAX_PLAN_BYTES
from orchestrator.plan.model.plan import Plan


def load_plan_text(text: str, file: str = "<plan>") -> Plan:
    """Validate plan text; `file` is only used in error locations."""
    doc, marks = read_yaml(text, file)
    checked = check_document(doc)
    if checked.problems or checked.plan is None:
        raise PlanError(locate_all(checked.problems, marks, file))
    return checked.plan


def check_plan(plan: Plan) -> Plan:
    """Check a plan built in Python (`Plan.model_validate(...)`) as `load_plan` checks a file; raise
    PlanError (located at `<plan NAME>`, there is no text to point into) or return the checked plan."""
    checked = check_document(plan.model_dump(exclude_unset=True))
    if checked.problems or checked.plan is None:
        raise PlanError(locate_all(checked.problems, Marks({}, {}), f"<plan {plan.name}>"))
    return checked.plan


def _refuse(path: str | Path, message: str) -> PlanError:
    return PlanError([Issue(str(path), 1, 1, (), message)])


def read_bounded(path: str | Path, what: str = "plan") -> bytes:
    """The `what` file's bytes (a plan or a profile), at most MAX_PLAN_BYTES. Only a regular file is read:
    /dev/zero would never end, and a FIFO would block. The path is checked, opened without blocking, and the
    opened file checked again (the path may have changed in between); no more than MAX_PLAN_BYTES + 1 bytes
    are ever read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise _refuse(path, f"the {what} is not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _refuse(path, f"the {what} is not a regular file")
            if info.st_size > MAX_PLAN_BYTES:
                raise _refuse(path, f"the {what} file is larger than {MAX_PLAN_BYTES} bytes")
            chunks, size = [], 0
            while size <= MAX_PLAN_BYTES and (chunk := os.read(fd, MAX_PLAN_BYTES + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _refuse(path, f"cannot read the {what}: {exc.strerror or exc}") from None
    except ValueError as exc:   # a path with a NUL byte
        raise _refuse(path, f"cannot read the {what}: {exc}") from None
    data = b"".join(chunks)
    if len(data) > MAX_PLAN_BYTES:   # the file grew after fstat
        raise _refuse(path, f"the {what} file is larger than {MAX_PLAN_BYTES} bytes")
    return data


def read_text(path: str | Path, what: str = "plan") -> str:
    """The file as text (UTF-8), bounded as read_bounded reads it; PlanError otherwise."""
    data = read_bounded(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError([Issue(str(path), 1, 1, (), f"the {what} is not UTF-8 text ({exc.reason} at byte "
                                                     f"{exc.start})")]) from None


def load_plan(path: str | Path) -> Plan:
    """Load and validate a plan file; raise PlanError listing every problem as FILE:LINE:COL."""
    return load_plan_text(read_text(path), str(path)).read_from(str(Path(path).resolve().parent))


def plan_sha256(path: str | Path) -> str:
    """Hex sha256 of the plan file's bytes (stored with every run of the plan)."""
    return hashlib.sha256(read_bounded(path)).hexdigest()
