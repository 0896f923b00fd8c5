"""The engine asks `apply` again while an agent answers `busy` (it still holds an earlier run for a manager
connection it has not found dead yet), for a bounded time; any other refusal fails at once. The client here
answers as an agent does: the coded errors of schemas/protocol's error reply."""
from __future__ import annotations

import asyncio

import pytest

from orchestrator.agent_client import AgentError
from orchestrator.engine.agent_ops import apply_when_free
from schemas import protocol


class _Agent:
    def __init__(self, answers: list[str | None]) -> None:
        self.answers, self.calls = list(answers), 0

    async def apply(self, args):
        self.calls += 1
        code = self.answers.pop(0)
        if code is not None:
            raise AgentError("receiver", "apply", code, f"run r0 is owned by session #2 ({code})", "run_id")
        return "applied"


ARGS = protocol.ApplyArgs(run_id="r1-x", state=protocol.HostState())


def test_busy_is_asked_again_until_the_agent_lets_the_old_run_go():
    agent = _Agent(["busy", "busy", None])
    assert asyncio.run(apply_when_free(agent, ARGS, wait_s=1.0, poll_s=0.01)) == "applied" and agent.calls == 3


def test_busy_for_longer_than_the_wait_and_any_other_refusal_fail():
    agent = _Agent(["busy"] * 50)
    with pytest.raises(AgentError, match=r"\[busy\]"):
        asyncio.run(apply_when_free(agent, ARGS, wait_s=0.05, poll_s=0.02))
    assert 2 <= agent.calls <= 4
    refused = _Agent(["refused", None])
    with pytest.raises(AgentError, match=r"\[refused\]"):
        asyncio.run(apply_when_free(refused, ARGS, wait_s=1.0, poll_s=0.01))
    assert refused.calls == 1
