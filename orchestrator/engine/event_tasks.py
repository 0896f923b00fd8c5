"""Plan events -> `event` tasks at absolute times (pure). docs/plans.md "Events".

A chain change carries the whole stage as it must become, built from the run's chain with the earlier
events on the same interface applied (a `set_loss` after a `set_delay` keeps the new delay): `tc qdisc
change` on netem resets every parameter it is not given.
"""
from __future__ import annotations

from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from orchestrator.plan.expansion.runspec import EventSpec
from schemas import protocol
from schemas.events import Blackout, ChangeStage, StopFlows
from schemas.qdiscs.htb import Htb
from schemas.qdiscs.netem import Netem

STAGE_KIND = {"set_delay": Netem, "set_loss": Netem, "set_rate": Htb}


class EventError(ValueError):
    """An event the run's chain or flows cannot carry out (refused at preflight)."""


def _changed(stage, e: EventSpec):
    if e.action == "set_delay":
        return stage.model_copy(update={"delay_ns": e.delay_ns})
    if e.action == "set_loss":
        return stage.model_copy(update={"loss": e.loss})
    return stage.model_copy(update={"rate_bit": e.rate_bit, "ceil_bit": e.rate_bit})


def event_actions(spec: RunSpec) -> list[tuple[int, EventSpec, object]]:
    """(plan index, event, protocol action) in time order; raises EventError naming the event."""
    chains = {(role, toward): list(chain) for role, hp in spec.hosts.items() for toward, chain in hp.qdiscs.items()}
    out = []
    for i, e in sorted(enumerate(spec.events), key=lambda ie: (ie[1].at_s, ie[0])):
        where = f"events[{i}] ({e.action} at {e.at_s:g}s on {e.host})"
        if e.action == "ack_blackout":
            out.append((i, e, Blackout(duration_ns=round(e.duration_s * 1e9))))
        elif e.action == "stop_flows":
            ids = [f"iperf3-client-{f.flow_id}" for f in spec.flows if f.group == e.group and f.src == e.host]
            if not ids:
                raise EventError(f"{where}: {e.host} sends no flow of group {e.group}")
            out.append((i, e, StopFlows(task_ids=ids)))
        else:
            key = (e.link.host, e.link.toward)
            chain = chains.get(key, [])
            kind = STAGE_KIND[e.action]
            found = [k for k, st in enumerate(chain) if isinstance(st, kind)]
            if not found:
                have = ", ".join(st.kind for st in chain) or "no chain"
                raise EventError(f"{where}: {e.link.label} has no {kind.model_fields['kind'].default} stage "
                                 f"to change ({have}); put one there (hosts.{e.host}.qdiscs or the bottleneck)")
            k = found[0]
            chain[k] = _changed(chain[k], e)
            out.append((i, e, ChangeStage(stage_index=k, stage=chain[k])))
    return out


def event_problems(spec: RunSpec) -> list[str]:
    try:
        event_actions(spec)
    except EventError as exc:
        return [str(exc)]
    return []


def event_tasks(spec: RunSpec, inv: Inventory, t0_ns: int) -> dict[str, list[protocol.EventTask]]:
    """Per host role, the run's event tasks; each starts at T0 + at."""
    out: dict[str, list[protocol.EventTask]] = {}
    for i, e, action in event_actions(spec):
        iface = inv.hosts[e.host].iface_toward(e.link.toward) if e.link is not None else None
        out.setdefault(e.host, []).append(protocol.EventTask(
            task_id=f"event-{i}", start_ns=t0_ns + round(e.at_s * 1e9), index=i, name=e.action,
            interface=iface, action=action))
    return out
