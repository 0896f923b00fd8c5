"""tc commands issued through a `tc -force -batch -` process started ahead of time.

A timed event must not pay for a process start at its moment: in a loaded TCG guest fork+exec of tc took
0.7 s (VM lab, set_delay). The batch process is spawned when the task is scheduled and blocks on its stdin;
at the event the agent writes the command lines and closes stdin, and tc performs them in order and exits.
`returned_ns` (tc's exit) bounds from above when the last change was in force.

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

    async def run(self, argvs: list[list[str]]) -> dict[str, Any]:
        """Issue the commands; when they were issued and when tc returned, and which of them failed (1-based;
        tc's exit status also counts the warm lines' refusals, so it is not used)."""
        data = "".join(batch_line(a) + "\n" for a in argvs).encode()
        issued = time.time_ns()
        if self.proc is None:   # not prepared (spawn failed earlier): pay for the process start now
            await self.start()
        assert self.proc is not None
        _, err = await asyncio.wait_for(self.proc.communicate(data), 30)
        returned = time.time_ns()
        stderr = err.decode(errors="replace")
        failed = [n - self.warm_lines for n in failed_lines(stderr) if n > self.warm_lines]
        return {"issued_ns": issued, "returned_ns": returned, "argv": argvs, "warm_lines": self.warm_lines,
                "failed_lines": failed, "stderr": stderr[-2000:]}

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await procs.terminate(self.proc)
