"""Provenance of a run (docs/database.md): who ran it, on which testbed, with which tcplab and which plan commit.

The facts are collected once per `tcplab run` or campaign night (`collect`, effects: environment, git) into a
`Provenance`; `columns` (pure) turns them into the run row's columns for one plan file. Every run row the engine
builds -- complete, failed or refused -- carries them, and the run record on disk keeps them for a re-ingest.
"""
from __future__ import annotations

import getpass
import os
import socket
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

USER_ENV = "TCPLAB_USER"          # who ran it, when the OS user is a shared service account
TESTBED_ENV = "TCPLAB_TESTBED"    # the testbed's name, when <inventory kind>:<manager host> is not enough
TCPLAB_ROOT = Path(__file__).resolve().parents[2]   # the checkout (or site-packages) holding orchestrator/
GIT_TIMEOUT_S = 10


@dataclass(frozen=True)
class Provenance:
    run_by: str | None = None
    testbed: str | None = None
    tcplab_version: str | None = None
    tcplab_commit: str | None = None
    plan_commits: Mapping[str, str | None] = field(default_factory=dict)   # plan path as in the plan row -> commit

    def columns(self, plan_path: str | None) -> dict[str, str | None]:
        """The run row's provenance columns for a run of the plan at `plan_path` (as stored in plan.path)."""
        return {"run_by": self.run_by, "testbed": self.testbed, "tcplab_version": self.tcplab_version,
                "tcplab_commit": self.tcplab_commit,
                "plan_commit": self.plan_commits.get(plan_path) if plan_path is not None else None}


def plan_commit(head: str | None, porcelain: str) -> str | None:
    """The commit a plan file was run from: HEAD of its repository, "-dirty" when the file differs from it (modified
    or untracked: `git status --porcelain -- FILE` printed something); None outside git."""
    if not head:
        return None
    return head + ("-dirty" if porcelain.strip() else "")


def testbed_name(env: Mapping[str, str], inventory_kind: str, manager_host: str) -> str:
    return env.get(TESTBED_ENV) or f"{inventory_kind}:{manager_host}"


def run_by(env: Mapping[str, str], os_user: str | None) -> str | None:
    return env.get(USER_ENV) or os_user


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def tcplab_version() -> str | None:
    try:
        return metadata.version("tcplab")
    except metadata.PackageNotFoundError:
        return None


def tcplab_commit(version: str | None) -> str | None:
    """git describe of the tcplab checkout this code runs from; the package version when it is not a checkout."""
    return _git(TCPLAB_ROOT, "describe", "--always", "--dirty", "--abbrev=12") or version


def plan_commit_of(path: Path) -> str | None:
    where = path.resolve().parent
    return plan_commit(_git(where, "rev-parse", "HEAD"), _git(where, "status", "--porcelain", "--", path.name) or "")


def _os_user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


def collect(inventory_kind: str, plan_paths: Iterable[str | Path] = ()) -> Provenance:
    """The facts of this manager process (environment, git), for the plans it is about to run."""
    version = tcplab_version()
    return Provenance(run_by=run_by(os.environ, _os_user()),
                      testbed=testbed_name(os.environ, inventory_kind, socket.gethostname()),
                      tcplab_version=version, tcplab_commit=tcplab_commit(version),
                      plan_commits={str(p): plan_commit_of(Path(p)) for p in plan_paths})
