"""A real agent process for the control-connection tests, started and killed by pid.

It runs in a private mount namespace (`unshare --mount`): the agent mounts tracefs when it finds none, which
must not happen on the test machine itself. `own_netns=True` also gives it a network namespace of its own, so
the sysctls an `apply`/`reset` touches are not the machine's (it then listens on a UNIX socket)."""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the agent runs in a private mount namespace (unshare --mount)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux) for the agent's private mount namespace"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AgentProcess:
    proc: subprocess.Popen
    url: str
    token: bytes
    log_path: Path
    tmp: Path
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """The agent's own pid (unshare execs it: the same process)."""
        return self.proc.pid

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start_agent(tmp: Path, own_netns: bool = False, tls_args: list[str] | None = None,
                timeout_s: float = 60) -> AgentProcess:
    token = secrets.token_hex(32).encode()
    (tmp / "token").write_bytes(token)
    if own_netns:
        url = f"unix:{tmp / 'agent.sock'}"
        listen = url
    else:
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        listen = url
    log_path = tmp / "agent.log"
    unshare = ["unshare", "--mount", "--propagation", "private"] + (["--net"] if own_netns else [])
    argv = unshare + [sys.executable, "-m", "agents", "--name", "sv", "--listen", listen,
                      "--token-file", str(tmp / "token"), "--artifacts", str(tmp / "artifacts")] + (tls_args or [])
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    agent = AgentProcess(proc, url, token, log_path, tmp)
    deadline = time.monotonic() + timeout_s
    while "listening host=sv" not in agent.log_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            agent.stop()
            raise RuntimeError(f"agent did not start (rc {proc.returncode}):\n{agent.log_text()[-3000:]}")
        time.sleep(0.1)
    return agent


@contextlib.contextmanager
def running_agent(tmp: Path, **options) -> Iterator[AgentProcess]:
    """A started agent for one test (pytest skips with the reason when agents cannot run here), stopped by pid
    afterwards whatever the test did. `options` go to start_agent."""
    import pytest

    if reason := unavailable():
        pytest.skip(reason)
    proc = start_agent(tmp, **options)
    try:
        yield proc
    finally:
        proc.stop()
