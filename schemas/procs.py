"""Running external tools, for the agents and the labs alike: argv lists only (never a shell), results captured,
failures typed. It lives in schemas/ because both sides need it and the manager imports no agent code."""
from __future__ import annotations

import asyncio
import socket
import subprocess
from dataclasses import dataclass


class CommandFailed(Exception):
    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.argv, self.returncode, self.stderr = argv, returncode, stderr.strip()
        super().__init__(f"{' '.join(argv)} exited {returncode}: {self.stderr}")


class ToolMissing(CommandFailed):
    """The program is not installed (or not on PATH): said in one line, never a FileNotFoundError traceback."""

    def __init__(self, argv: list[str]):
        super().__init__(argv, 127, f"{argv[0]} not found on host {socket.gethostname()}")

    def __str__(self) -> str:
        return self.stderr


@dataclass(frozen=True)
class Completed:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def run(argv: list[str], check: bool = True, timeout: float = 30.0, cwd: str | None = None,
        stdin_text: str | None = None) -> Completed:
    """Run a tool invocation synchronously (tc, ethtool, ip: milliseconds; apt, tar: `timeout` says how long).
    `stdin_text`: what the tool reads on its stdin (`tc -batch -`)."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise TypeError("argv must be a list of str")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd,
                              input=stdin_text)
    except FileNotFoundError:
        raise ToolMissing(argv) from None
    done = Completed(argv, proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise CommandFailed(argv, proc.returncode, proc.stderr or proc.stdout)
    return done


async def terminate(proc: asyncio.subprocess.Process, grace_s: float = 3.0) -> int:
    """Stop one child by its pid (SIGTERM, then SIGKILL) and reap it."""
    if proc.returncode is None:
        try:
            proc.terminate()
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return proc.returncode if proc.returncode is not None else -1
