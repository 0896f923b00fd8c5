"""What every scheduled task shares: the start at an absolute CLOCK_REALTIME time, the state the manager
polls, the artifact it leaves, and the check that the artifacts filesystem did not fill up under it."""
from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

from schemas import protocol


async def sleep_until(t_ns: int) -> None:
    delay = (t_ns - time.time_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


def realtime_minus_mono_ns() -> int:
    """Offset to convert trace-clock `mono` stamps to CLOCK_REALTIME (sampled at start and end)."""
    a = time.clock_gettime_ns(time.CLOCK_REALTIME)
    m = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    b = time.clock_gettime_ns(time.CLOCK_REALTIME)
    return (a + b) // 2 - m


def skipped_before(first_ns: int, skip: int, interval_ns: int, stop_ns: int) -> int:
    """How many of `skip` slots from first_ns on (every interval_ns) fall before stop_ns: a poll that overran
    the end of the sampling does not count slots that never were to be polled as missed."""
    if first_ns >= stop_ns:
        return 0
    return min(skip, (stop_ns - first_ns - 1) // interval_ns + 1)


def next_beat(slot_ns: int, now_ns: int, interval_ns: int, stop_ns: int) -> tuple[int, int]:
    """The slot after `slot_ns` that a poll ending at `now_ns` can still keep, and how many slots (before
    stop_ns) it overran. A poller that falls behind skips slots, it never queues them up: a 1 ms beat on a
    loaded guest must still end at stop_ns, not several times the run's length later."""
    nxt = slot_ns + interval_ns
    if now_ns < nxt:
        return nxt, 0
    skip = (now_ns - nxt) // interval_ns + 1
    return nxt + skip * interval_ns, skipped_before(nxt, skip, interval_ns, stop_ns)


MISSED_REMARK_FRACTION = 0.05


def missed_remark(polls: int, missed: int, interval_ms: int) -> str:
    """The remark (a G-TASK flag on the run) of a poller that kept fewer than 95 % of its slots."""
    slots = polls + missed
    if not slots or missed <= MISSED_REMARK_FRACTION * slots:
        return ""
    return (f"polled {polls} of {slots} slots of {interval_ms} ms ({missed} skipped: each poll took longer than "
            "the interval); the series is coarser than asked")


class TaskRunner:
    kind = ""

    def __init__(self, spec: Any, run_dir: Path):
        self.spec = spec
        self.run_dir = run_dir
        self.state = "scheduled"
        self.detail = ""
        self.guard: str | None = None   # the guard a remark on a finished task belongs to
        self.meta: dict[str, Any] = {}
        self.stop_event = asyncio.Event()
        self.stop_flag = threading.Event()   # the same, for the samplers' threads (they sleep on it)

    def request_stop(self) -> None:
        """Stop the task now (the `stop` and `reset` ops, a peer event): wakes its coroutine and its thread."""
        self.stop_event.set()
        self.stop_flag.set()

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    async def run(self) -> None:
        await sleep_until(self.spec.start_ns)
        self.state = "running"
        try:
            await self.execute()
            self.state = "done"
        except OSError as exc:
            self.state, self.detail = "failed", (self._no_space() if exc.errno == errno.ENOSPC
                                                 else f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the failure is reported to the manager through status/collect
            self.state, self.detail = "failed", f"{type(exc).__name__}: {exc}"
        # a tool writing its artifact may ignore a failed write (tcpdump does): a full artifacts filesystem
        # after the task means the artifact is truncated, whatever the tool said
        if self.state == "done" and self.out_name and artifacts_disk_full(self.run_dir):
            self.state, self.guard, self.detail = "failed", None, self._no_space()

    def _no_space(self) -> str:
        path = self.run_dir / self.out_name if self.out_name else self.run_dir
        size = path.stat().st_size if path.is_file() else 0
        return (f"no space left on device: the artifacts filesystem of {self.run_dir} is full; "
                f"{path.name} is truncated at {size} bytes")

    async def execute(self) -> None:
        raise NotImplementedError

    out_name = ""
    artifact_kind = ""

    def artifacts(self) -> list[tuple[Path, str]]:
        path = self.run_dir / self.out_name
        return [(path, self.artifact_kind or self.kind)] if self.out_name and path.exists() else []

    async def until_stop(self, deadline_ns: int) -> None:
        """Sleep until `deadline_ns` or until the manager stops the task (the `stop` op once the flows are
        over): a passive task ends as soon as the run no longer needs it, its stop_ns is only the bound."""
        delay = (deadline_ns - time.time_ns()) / 1e9
        if delay > 0 and not self.stop_event.is_set():
            try:
                await asyncio.wait_for(self.stop_event.wait(), delay)
            except TimeoutError:
                pass

    def status(self) -> protocol.TaskStatus:
        return protocol.TaskStatus(task_id=self.task_id, kind=self.kind, state=self.state, detail=self.detail,
                                   guard=self.guard)


DISK_FULL_BYTES = 64 * 1024


def artifacts_disk_full(path: Path) -> bool:
    """Whether the filesystem holding `path` has less than DISK_FULL_BYTES left for the agent."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < DISK_FULL_BYTES
