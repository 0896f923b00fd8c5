"""Identifiers that name files on a host running as root: a run id and a task id become directory and file
names under an agent's artifacts root, so they must not be able to name anything else. They start with a
letter or digit (so never `.`, `..` or an option-like `-x`) and hold only letters, digits, `_`, `.` and `-`
(so never a `/`, a NUL or a newline that would forge a log line)."""
from __future__ import annotations

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
