"""Processes a task starts (iperf3, tcpdump, ss) die with the agent.

The agent stops its children by pid when a task ends or the agent shuts down; when the agent itself is killed
(SIGKILL, OOM, a crash) nobody does, and an orphaned tcpdump went on writing into a run folder and an iperf3
server held its port until the lab was taken down. Each child therefore asks the kernel for SIGKILL when its
parent goes (PR_SET_PDEATHSIG). It is set by util-linux `setpriv --pdeathsig`, which then execs the tool in
the same process (same pid, so stopping by pid is unchanged), rather than by a Python `preexec_fn`, which is
unsafe in a process with threads (the agent runs blocking work in threads). The death signal follows the
thread that forked; asyncio forks on the event-loop thread, which lives as long as the agent.
"""
from __future__ import annotations

import asyncio
import shutil
from typing import Any

DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]


def with_parent_death(argv: list[str], have_setpriv: bool) -> list[str]:
    """The argv that runs `argv` so that it is killed when the agent dies (pure)."""
    return [*DIE_WITH_PARENT, *argv] if have_setpriv else list(argv)


_HAVE_SETPRIV = shutil.which("setpriv") is not None


async def spawn(argv: list[str], **kwargs: Any) -> asyncio.subprocess.Process:
    """asyncio.create_subprocess_exec for a task's helper process, tied to the agent's life."""
    return await asyncio.create_subprocess_exec(*with_parent_death(argv, _HAVE_SETPRIV), **kwargs)
