"""The end of a run's measurement (effects): the engine's hooks around it, the wait for the flows to be over
before the passive tasks are stopped, and each host's stop, collect and reset (docs/architecture.md, "Timeline
of a run")."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.agent_client import AgentClient
from orchestrator.engine import bind, timing
from schemas import protocol
from schemas.flag import Flag

if TYPE_CHECKING:
    from orchestrator.engine.runner import RunEngine

log = logging.getLogger("tcplab.manager")
TAIL_POLL_S = 0.02        # how often the senders are asked whether their flows are over


async def _noop(*_: object) -> None:
    return None


@dataclass
class Hooks:
    """What run_many does around a run's measurement (see RunEngine.execute)."""
    before_flows: Callable[[int], Awaitable[None]] = _noop   # once scheduled, with T0 (ns)
    after_flows: Callable[[], Awaitable[None]] = _noop


async def timed(op: Awaitable) -> int:
    """The ns an op took, from sending to the answer."""
    began = time.monotonic_ns()
    await op
    return time.monotonic_ns() - began


async def wait_flows_over(engine: RunEngine, tasks: dict[str, list], tl: bind.Timeline,
                          margins: timing.Margins) -> None:
    """After the flows' scheduled end: wait until every flow task is done (its connections closed on the
    sender), then `grace` (the final ACK crossing the capture host); the engine then stops every host's passive
    tasks. Without early stop, or when the flows are not done by stop_ns, until the tasks' stop_ns."""
    flow_ids = bind.flow_task_ids(tasks)
    if not margins.early_stop or not flow_ids:
        await engine.run_watching(tasks, max(0.0, (tl.stop_ns - time.time_ns()) / 1e9))
        return
    while time.time_ns() < tl.stop_ns:
        done, _ = await engine.settle(flow_ids, lambda r, c: c.status())
        if bind.flows_over(flow_ids, {r: st.tasks for r, st in done.items()}):
            await asyncio.sleep(min(margins.grace_ns, max(0, tl.stop_ns - time.time_ns())) / 1e9)
            return
        await asyncio.sleep(TAIL_POLL_S)


def task_flags(role: str, tasks: Iterable[protocol.TaskStatus]) -> list[Flag]:
    """A task that finished but has a remark (a capture that lost packets: G-CAPTURE) flags the run."""
    return [Flag(guard=t.guard or "G-TASK", host=role, message=f"{t.task_id}: {t.detail}")
            for t in tasks if t.state == "done" and t.detail]


async def finish_hosts(engine: RunEngine, run_id: str, tasks: dict[str, list], run_dir: Path,
                       margins: timing.Margins, clock: timing.PhaseClock, evidence: list[dict], reset_done: set[str]
                       ) -> tuple[dict[str, list[dict]], list[Flag], list[str]]:
    """Every host's stop, collect and reset in a row, each host on its own: a host that has sent its artifacts
    is reset while the others still send theirs. Appends each reset's evidence and marks the host in
    `reset_done`; returns the artifacts per host, the tasks' flags and what failed (hosts and tasks)."""
    ends: dict[str, list[float]] = {}

    async def finish(role: str, client: AgentClient) -> protocol.CollectResult:
        began = time.monotonic()
        try:
            if margins.early_stop:
                await client.stop()
            ends[role] = [time.monotonic()]
            res = await client.collect(protocol.CollectArgs(run_id=run_id, timeout_s=60), sink=run_dir / role)
            ends[role].append(time.monotonic())
            return res
        finally:
            evidence.append(await engine.reset_one(role, client))
            reset_done.add(role)
            marks = [began, *ends.get(role, []), time.monotonic()]
            log.info("run end host=%s run=%s ms=%s", role, run_id,
                     "/".join(f"{(b - a) * 1000:.0f}" for a, b in zip(marks, marks[1:], strict=False)))

    collected, lost = await engine.settle(tasks, finish)
    # the steps' ends on the critical path: the last host to finish each
    clock.divide(("stop", "collect", "reset"), [max((e[i] for e in ends.values() if len(e) > i), default=0.0)
                                                for i in range(2)])
    failed = [str(exc) for exc in lost.values()]
    artifacts: dict[str, list[dict]] = {}
    flags: list[Flag] = []
    for role, res in collected.items():   # what the others sent is kept, also when one host failed
        artifacts[role] = [a.model_dump(mode="json") for a in res.artifacts]
        failed += [f"{role}/{t.task_id}: {t.detail}" for t in res.tasks if t.state != "done"]
        flags += task_flags(role, res.tasks)
    return artifacts, flags, failed
