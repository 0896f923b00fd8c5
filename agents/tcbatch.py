"""tc commands issued through a `tc -force -batch -` process started ahead of time.

A timed event must not pay for a process start at its moment: in a loaded TCG guest fork+exec of tc took
0.7 s (VM lab, set_delay). The batch process is spawned when the task is scheduled and blocks on its stdin;
at the event the agent writes the command lines and closes stdin, and tc performs them in order and exits.
A last, always-refused line follows the commands: its "Command failed" on stderr (unbuffered) says the
commands before it are done, so `returned_ns` bounds from above when the last change was in force
without waiting for tc's exit (0.13 s more in a loaded TCG guest).

Started is not enough: the guests run tc from the host's filesystem (virtiofs/9p), so code tc has not run yet
(netem's option parser, the exit path) is paged in at the event -- 0.2 s before the change and another 0.25 s
before tc's exit in a loaded TCG guest. So the batch first runs `warm` lines: the same commands aimed at
nothing (a handle or class that does not exist, `change` without create), which the kernel refuses without
changing anything; their errors are left out of the record.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from agents.children import spawn
from schemas import procs

# what a batch line may hold: tc's own words, numbers and units, interface names, the BPF bytecode string
# (its spaces are quoted); no quote, comment sign or newline that would change how tc splits the line
BATCH_ARG = re.compile(r"[A-Za-z0-9_.:,%/ -]+")
SENTINEL_WAIT_S = 10.0
MAX_STDERR_LINES = 1000   # tc writes two or three lines per refused command
FAILED_LINE = re.compile(r"^Command failed -:(\d+)$", re.MULTILINE)


def batch_line(argv: list[str]) -> str:
    """One `tc -batch` line for a tc argv (pure): the words after `tc`, quoted where they hold spaces."""
    if not argv or argv[0] != "tc":
        raise ValueError(f"not a tc command: {argv!r}")
    for arg in argv[1:]:
        if not BATCH_ARG.fullmatch(arg):
            raise ValueError(f"tc argument {arg!r} cannot go on a batch line")
    return " ".join(f'"{a}"' if " " in a else a for a in argv[1:])


def failed_lines(stderr: str) -> list[int]:
    """The 1-based batch lines tc reported as failed ("Command failed -:2")."""
    return [int(n) for n in FAILED_LINE.findall(stderr)]


class PreparedTc:
    """One tc batch process, started now, given its commands later (once)."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.warm_lines = 0

    async def start(self, warm: list[list[str]] | None = None) -> None:
        self.proc = await spawn(["tc", "-force", "-batch", "-"], stdin=asyncio.subprocess.PIPE,
                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        if warm:
            assert self.proc.stdin is not None
            self.proc.stdin.write("".join(batch_line(a) + "\n" for a in warm).encode())
            await self.proc.stdin.drain()
            self.warm_lines = len(warm)

    async def run(self, argvs: list[list[str]], sentinel: list[str]) -> dict[str, Any]:
        """Issue the commands, then `sentinel` (a warm line: always refused); when they were issued and when
        tc reported the sentinel's refusal on stderr (unbuffered, so this is when the commands before it
        were done, without waiting for tc's exit), and which of the commands failed (1-based)."""
        if self.proc is None:   # not prepared (the spawn failed earlier): pay for the process start now
            await self.start([sentinel])
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stderr is not None
        done_line = f"Command failed -:{self.warm_lines + len(argvs) + 1}"
        issued = time.time_ns()
        self.proc.stdin.write("".join(batch_line(a) + "\n" for a in [*argvs, sentinel]).encode())
        await self.proc.stdin.drain()
        err: list[str] = []
        returned = None
        for _ in range(MAX_STDERR_LINES):
            try:   # a sentinel tc accepted would leave tc waiting for more input: stop waiting then
                raw = await asyncio.wait_for(self.proc.stderr.readline(), SENTINEL_WAIT_S)
            except TimeoutError:
                break
            line = raw.decode(errors="replace")
            if not line:
                break
            err.append(line)
            if line.strip() == done_line:
                returned = time.time_ns()
                break
        self.proc.stdin.close()
        rest = await asyncio.wait_for(self.proc.stderr.read(), 30)
        await asyncio.wait_for(self.proc.wait(), 30)
        stderr = "".join(err) + rest.decode(errors="replace")
        failed = [n - self.warm_lines for n in failed_lines(stderr) if 0 < n - self.warm_lines <= len(argvs)]
        return {"issued_ns": issued, "returned_ns": returned if returned is not None else time.time_ns(),
                "exited_ns": time.time_ns(), "argv": argvs, "warm_lines": self.warm_lines, "failed_lines": failed,
                "stderr": stderr[-2000:]}

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await procs.terminate(self.proc)
