"""The end of a run's measurement (effects): the engine's hooks around it, and the wait for the flows to be
over before the passive tasks are stopped (docs/architecture.md, "Timeline of a run")."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.engine import bind, timing

if TYPE_CHECKING:
    from orchestrator.engine.runner import RunEngine

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
