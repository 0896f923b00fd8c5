"""What an `event` task does at its absolute time (docs/plans.md "Events"): the typed actions the agent
performs, each on an interface the agent was given or on the run's own flow tasks. The manager turns a
plan's `set_delay` / `set_loss` / `set_rate` into `change_stage` with the chain stage as it must become
(the whole stage: `tc qdisc change` on netem resets every parameter it is not given)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import limits
from schemas.identifiers import TASK_ID_PATTERN
from schemas.qdiscs.htb import Htb
from schemas.qdiscs.netem import Netem

MAX_CHAIN_STAGES = 16   # a chain's depth: stage i has handle i+1:
PLAN_ACTIONS = ("ack_blackout", "set_delay", "set_loss", "set_rate", "stop_flows")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChangeStage(_Strict):
    """Replace stage `stage_index` of the interface's chain by `stage` (same kind): netem with `tc qdisc
    change`, htb with `tc class change` of its class."""

    op: Literal["change_stage"] = "change_stage"
    stage_index: int = Field(ge=0, lt=MAX_CHAIN_STAGES, description="the stage's position in the chain (handle i+1:)")
    stage: Annotated[Netem | Htb, Field(discriminator="kind")]


class Blackout(_Strict):
    """Drop every packet the interface sends for `duration_ns`: a clsact egress filter whose classic BPF
    program returns TC_ACT_SHOT, removed at the end of the window."""

    op: Literal["blackout"] = "blackout"
    duration_ns: int = Field(gt=0, le=limits.MAX_RUN_SECONDS * 10**9)


class StopFlows(_Strict):
    """Stop these flow tasks of the same schedule (their iperf3 clients are terminated)."""

    op: Literal["stop_flows"] = "stop_flows"
    task_ids: list[Annotated[str, Field(pattern=TASK_ID_PATTERN)]] = Field(
        min_length=1, max_length=limits.MAX_TASKS_PER_SCHEDULE)


EventAction = Annotated[ChangeStage | Blackout | StopFlows, Field(discriminator="op")]
