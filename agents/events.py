"""Timed plan events (docs/plans.md "Events"): at an absolute CLOCK_REALTIME time the agent changes a chain
stage (netem delay/loss, htb rate), blacks out an interface's egress, or stops flow tasks of its schedule,
and records when the action was scheduled, issued and returned (= in effect), plus the read-back after it.

Pure argv builders first (tested against literal tc output), the runner last. Only interfaces on the
agent's allow-list reach here (op_schedule refuses others, as for every task with an `interface`).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from agents.host.argv import stage_params
from agents.taskbase import TaskRunner
from agents.tcbatch import PreparedTc
from schemas import procs
from schemas.events import Blackout, ChangeStage, StopFlows
from schemas.qdiscs import kind_of

# classic BPF "ret #2": with direct-action, cls_bpf takes the return value as the verdict, 2 = TC_ACT_SHOT.
# Classic BPF needs neither a compiler nor act_gact (absent from the host kernel), only cls_bpf and clsact.
DROP_ALL_BYTECODE = "1,6 0 0 2,"
BLACKOUT_PREF = "49"   # the egress filter's priority, so removal names exactly the filter the event added


def change_stage_argv(dev: str, change: ChangeStage) -> list[str]:
    """The tc command that makes stage `stage_index` of `dev`'s chain (agents/host/argv.chain_argv layout:
    stage i has handle i+1:, below i:1) equal `change.stage`: a class change for a classful shaper (htb
    keeps its rate in class i+1:1), else a qdisc change with the stage's full parameters."""
    i, stage = change.stage_index, change.stage
    kind = kind_of(stage)
    if kind.class_params is not None:
        return ["tc", "class", "change", "dev", dev, "parent", f"{i + 1}:", "classid", f"{i + 1}:1",
                *kind.class_params(stage)]
    where = ["root"] if i == 0 else ["parent", f"{i}:1"]
    return ["tc", "qdisc", "change", "dev", dev, *where, "handle", f"{i + 1}:", *stage_params(stage)]


def clsact_add_argv(dev: str) -> list[str]:
    return ["tc", "qdisc", "add", "dev", dev, "clsact"]


def blackout_filter_argv(dev: str) -> list[str]:
    return ["tc", "filter", "add", "dev", dev, "egress", "pref", BLACKOUT_PREF, "bpf", "da", "bytecode",
            DROP_ALL_BYTECODE]


def blackout_off_argv(dev: str, added_clsact: bool) -> list[list[str]]:
    if added_clsact:   # deleting clsact removes its filters with it
        return [["tc", "qdisc", "del", "dev", dev, "clsact"]]
    return [["tc", "filter", "del", "dev", dev, "egress", "pref", BLACKOUT_PREF]]


WARM_HANDLE = "fffe"   # no chain stage has it (stage i has i+1:) and clsact/ingress own ffff:


def warm_argv(dev: str, action: ChangeStage | Blackout) -> list[list[str]]:
    """Commands that run the same tc code as the event but change nothing (agents/tcbatch.py): the stage's
    change aimed at a handle or class that does not exist, the blackout's as `change` (no create)."""
    if isinstance(action, Blackout):
        return [["tc", "qdisc", "change", "dev", dev, "clsact"],
                ["tc", "filter", "change", *blackout_filter_argv(dev)[3:]]]
    argv = change_stage_argv(dev, action)
    i = action.stage_index
    if argv[1] == "class":
        return [[f"{i + 1}:{WARM_HANDLE}" if a == f"{i + 1}:1" else a for a in argv]]
    return [[f"{WARM_HANDLE}:" if a == f"{i + 1}:" and argv[k - 1] == "handle" else a for k, a in enumerate(argv)]]


def readback_argv(dev: str, change: ChangeStage | Blackout) -> dict[str, list[str]]:
    if isinstance(change, Blackout):
        return {"tc_filter": ["tc", "-j", "filter", "show", "dev", dev, "egress"]}
    out = {"tc_qdisc": ["tc", "-j", "qdisc", "show", "dev", dev]}
    if kind_of(change.stage).class_params is not None:   # iproute2 6.1 prints htb classes as text even with -j
        out["tc_class_text"] = ["tc", "class", "show", "dev", dev]
    return out


def read_back(argvs: dict[str, list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, argv in argvs.items():
        text = procs.run(argv, check=False).stdout
        try:
            out[name] = json.loads(text) if "-j" in argv else text
        except ValueError:
            out[name] = text
    return out


class EventRunner(TaskRunner):
    kind = "event"
    artifact_kind = "event"

    def __init__(self, spec: Any, run_dir: Any):
        super().__init__(spec, run_dir)
        self.peers: list[TaskRunner] = []   # the other tasks of the schedule (stop_flows acts on them)
        self.batches: list[PreparedTc] = []

    @property
    def out_name(self) -> str:
        return f"event-{self.spec.index}.json"

    async def run(self) -> None:
        # the tc processes start now, not at the event's time (agents/tcbatch.py)
        self.batches = [PreparedTc() for _ in range(2 if isinstance(self.spec.action, Blackout) else
                                                     1 if isinstance(self.spec.action, ChangeStage) else 0)]
        try:
            for b in self.batches:
                try:
                    await b.start(warm_argv(self.spec.interface, self.spec.action))
                except OSError:
                    pass   # PreparedTc.run starts it late; a missing tc then fails the task there
            await super().run()
        finally:
            for b in self.batches:
                await b.close()

    async def execute(self) -> None:
        s, action = self.spec, self.spec.action
        record: dict[str, Any] = {"index": s.index, "action": s.name, "interface": s.interface,
                                  "scheduled_ns": s.start_ns, "woke_ns": time.time_ns()}
        try:
            if isinstance(action, ChangeStage):
                record["stage"] = action.stage.model_dump(mode="json")
                record["start"] = done = await self.batches[0].run([change_stage_argv(s.interface, action)],
                                                                   warm_argv(s.interface, action)[-1])
                if done["failed_lines"]:
                    raise RuntimeError(f"tc refused the change: {done['stderr'].strip()}")
                record["readback"] = await asyncio.to_thread(read_back, readback_argv(s.interface, action))
            elif isinstance(action, Blackout):
                await self._blackout(action, record)
            elif isinstance(action, StopFlows):
                record["task_ids"] = list(action.task_ids)
                record["start"] = self._stop_flows(action)
        finally:
            (self.run_dir / self.out_name).write_text(json.dumps(record, indent=1))
        self.meta.update({k: record[k] for k in ("index", "action", "interface", "scheduled_ns")})

    async def _blackout(self, action: Blackout, record: dict[str, Any]) -> None:
        dev = self.spec.interface
        record["end_scheduled_ns"] = self.spec.start_ns + action.duration_ns
        record["duration_ns"] = action.duration_ns
        # no read before acting (it would add its own time to the lag): an existing clsact (not ours to
        # remove) makes the add (line 1) fail, and then only our filter goes at the end
        sentinel = warm_argv(dev, action)[-1]
        record["start"] = done = await self.batches[0].run([clsact_add_argv(dev), blackout_filter_argv(dev)], sentinel)
        added = 1 not in done["failed_lines"]
        done["added_clsact"] = added
        try:
            if 2 in done["failed_lines"]:
                raise RuntimeError(f"tc refused the drop filter: {done['stderr'].strip()}")
            record["readback"] = await asyncio.to_thread(read_back, readback_argv(dev, action))
            delay = (record["end_scheduled_ns"] - time.time_ns()) / 1e9
            # a stop (the run aborted) ends the window early: the filter never outlives the task
            await asyncio.wait_for(self.stop_event.wait(), max(delay, 0)) if delay > 0 else None
        except TimeoutError:
            pass
        finally:
            record["end"] = await self.batches[1].run(blackout_off_argv(dev, added), sentinel)

    def _stop_flows(self, action: StopFlows) -> dict[str, Any]:
        issued = time.time_ns()
        wanted = set(action.task_ids)
        stopped = []
        for peer in self.peers:
            if peer.task_id in wanted:
                stopped.append({"task_id": peer.task_id, "state": peer.state})
                peer.request_stop()
        return {"issued_ns": issued, "returned_ns": time.time_ns(), "stopped": stopped,
                "missing": sorted(wanted - {p.task_id for p in self.peers})}


def attach_peers(runners: list[TaskRunner]) -> None:
    """Give each event runner the schedule's other tasks (stop_flows stops some of them)."""
    for r in runners:
        if isinstance(r, EventRunner):
            r.peers = [p for p in runners if p is not r]
