"""The agent's artifacts root: a directory only the agent's user can write, reached without following a link.

The agent runs as root and removes, writes and sends back files below this directory on a manager's request.
If another local user could create or swap an entry on its path (a world-writable parent such as /var/tmp, a
symlink), those requests would reach files the user chose. So the root is created 0700 if absent, and refused
unless it is a real directory (not a symlink), owned by the agent's user and writable by nobody else.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeArtifactsRoot(Exception):
    """The artifacts root is not private to the agent; the message says why and what to do."""


def private_dir_problem(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with this lstat() result cannot be the artifacts root of an agent running as uid."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by the agent (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def ensure_artifacts_root(path: Path) -> Path:
    """Create the root (0700) if it does not exist, then refuse it unless it is private to this process's user.
    Returns the absolute path."""
    path = path.absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    problem = private_dir_problem(os.lstat(path), os.geteuid())
    if problem:
        raise UnsafeArtifactsRoot(f"artifacts root {path} {problem}: remove it or choose a directory only the "
                                  "agent's user can write")
    return path
