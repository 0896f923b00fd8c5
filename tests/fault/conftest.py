"""Fault-injection fixtures: a lab of our own (prefix TCPLAB_FAULT_PREFIX, default tcplabft), one SQLite
database and results folder shared by the fault tests (so each can count the completed runs of the others
before and after its fault), short plans, and helpers to find and signal the real processes.

Every test here carries the `lab` and `fault` markers: root, network namespaces, real tc/iperf3/tcpdump.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from orchestrator.lab import netns
from orchestrator.storage.db import open_db
from tests.lab.conftest import lab_unavailable, one_flow_plan, run_plan_quietly

FAULT_PREFIX = os.environ.get("TCPLAB_FAULT_PREFIX", "tcplabft")
FAULT_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(FAULT_TESTS):
            item.add_marker(pytest.mark.lab)
            item.add_marker(pytest.mark.fault)


@dataclass
class FaultLab:
    state_dir: Path
    prefix: str
    db_url: str
    results: Path

    @property
    def db(self) -> Engine:
        return open_db(self.db_url)

    def agent_pid(self, role: str) -> int:
        return json.loads((self.state_dir / "agents.json").read_text())[role]

    def namespace(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    def run(self, plan: Path, db_url: str | None = None, results: Path | None = None) -> tuple[int, str]:
        return run_plan_quietly(plan, db_url or self.db_url, self.state_dir, results or self.results)

    def complete_runs(self) -> dict[str, str]:
        """run_id -> finished_at of every complete run in the shared database."""
        with self.db.connect() as conn:
            rows = conn.execute(text("SELECT run_id, finished_at FROM run WHERE status = 'complete'")).all()
        return {r.run_id: str(r.finished_at) for r in rows}

    def run_row(self, run_id: str, db: Engine | None = None):
        with (db or self.db).connect() as conn:
            return conn.execute(text("SELECT status, error FROM run WHERE run_id = :r"), {"r": run_id}).one_or_none()

    def evidence(self, run_id: str, phase: str) -> dict[str, dict]:
        with self.db.connect() as conn:
            rows = conn.execute(text("SELECT host, data FROM host_evidence WHERE run_id = :r AND phase = :p"),
                                {"r": run_id, "p": phase}).all()
        return {r.host: json.loads(r.data) if isinstance(r.data, str) else r.data for r in rows}


@pytest.fixture(scope="session")
def fault_lab(tmp_path_factory) -> Iterator[FaultLab]:
    """The fault tests' own lab, torn down (namespaces, supervisor, agents, by pid) even when tests fail."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("faultlab")
    try:
        netns.up(state_dir, FAULT_PREFIX)
        yield FaultLab(state_dir, FAULT_PREFIX, f"sqlite:///{state_dir / 'faults.db'}", state_dir / "results")
    finally:
        netns.down(state_dir, FAULT_PREFIX)


def short_plan(tmp_path: Path, name: str, duration: str = "3s", repetitions: int = 1, captures: bool = False) -> Path:
    """A quickstart-like cell: one CUBIC flow server -> client through htb 20 Mbit/s on the aqm, `repetitions`
    runs of `duration`; with `captures`, tcpdump on both aqm interfaces (like quickstart)."""
    caps = ("  captures:\n    - {host: aqm, toward: client}\n    - {host: aqm, toward: server}\n" if captures else "")
    path = tmp_path / f"{name}.yaml"
    path.write_text(one_flow_plan(name, f"fault suite, {name}", duration=duration, run_extra=caps,
                                  repetitions=repetitions, tags="smoke, fault"))
    return path


def run_ids(plan: Path) -> list[str]:
    from orchestrator.plan import expand, load_plan
    return [s.run_id for s in expand(load_plan(plan))]


def ns_pids(namespace: str, comm: str) -> list[int]:
    """Pids of processes named `comm` in a lab namespace."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    found = []
    for pid in map(int, out):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                found.append(pid)
        except OSError:
            pass
    return found


def wait_for(what: str, cond: Callable[[], object], timeout_s: float, step_s: float = 0.1) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Background:
    """A callable run in a thread (run_plan drives its own event loop), with its result or exception."""

    def __init__(self, fn: Callable[[], object]):
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread by join()
            self.error = exc

    def join(self, timeout_s: float) -> object:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"still running after {timeout_s:.0f} s"
        if self.error:
            raise self.error
        return self.result
