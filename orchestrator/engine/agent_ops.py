"""Agent operations the engine retries (effects): an agent that answers `busy` because it still holds an
earlier run for a manager connection it has not yet found dead -- a UML host that stalled for minutes through a
run's reset (docs/uml-lab.md): the agent lets that run go once its keepalive gives up on the old connection,
within about 40 s -- is asked again for a while instead of failing every run after it."""
from __future__ import annotations

import asyncio
import logging
import time

from orchestrator.agent_client import AgentClient, AgentError
from schemas import protocol

log = logging.getLogger("tcplab.manager")
BUSY_WAIT_S, BUSY_POLL_S = 90.0, 5.0


async def apply_when_free(client: AgentClient, args: protocol.ApplyArgs, wait_s: float = BUSY_WAIT_S,
                          poll_s: float = BUSY_POLL_S) -> protocol.ApplyResult:
    """`apply`, asked again every `poll_s` while the agent answers `busy`, for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await client.apply(args)
        except AgentError as exc:
            if exc.code != "busy" or time.monotonic() + poll_s > deadline:
                raise
            log.info("apply waits host=%s run=%s: %s", exc.host, args.run_id, exc)
            await asyncio.sleep(poll_s)
