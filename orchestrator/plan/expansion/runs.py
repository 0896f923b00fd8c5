"""Plan expansion: `expand(plan) -> list[RunSpec]`, pure and deterministic, for a plan that passed the checks.

Run ids are `<plan>-<experiment>[-<arm>]-<hash>-r<repetition>`, where the hash covers the whole
instantiated run (not only the varied values): an id then names one configuration for good, and editing
anything that changes a run gives it a new id, so the engine never mistakes an old result for a new run.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from pydantic import BaseModel

from orchestrator.plan.expansion.adapt import Adaptation, adaptation
from orchestrator.plan.expansion.build import (
    ack_policy_spec,
    analysis_spec,
    capture_points,
    event_specs,
    flow_specs,
    host_specs,
    kernel_trace_spec,
    merged_host_section,
    qdisc_stat_links,
    ss_interval_ms,
)
from orchestrator.plan.expansion.derive import derived_values
from orchestrator.plan.expansion.instantiate import CellRun, instantiate_all, run_key
from orchestrator.plan.expansion.matrix import all_assignments, param_name
from orchestrator.plan.expansion.runspec import ProfileRef, RunSpec, TopologySpec
from orchestrator.plan.model.paths import KeyPath, get_in
from orchestrator.plan.model.plan import Plan
from orchestrator.plan.model.profile import Profile
from orchestrator.plan.model.quantities import Quantity
from orchestrator.plan.model.topology import plan_graph


def varied_fields(plan: Plan) -> dict[str, KeyPath]:
    """Every field path the plan varies anywhere (experiments, arms, matrices), in plan order."""
    out: dict[str, KeyPath] = {}
    for a in all_assignments(plan):
        out.setdefault(a.dotted, a.path)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Quantity):
        return value.raw
    if isinstance(value, BaseModel):   # the short form, but a queue or stage always says its kind
        kind = {"kind": value.kind} if "kind" in type(value).model_fields else {}
        return {**kind, **value.model_dump(mode="json", exclude_defaults=True)}
    return value


def run_params(plan: Plan, r: CellRun, varied: dict[str, KeyPath]) -> dict[str, Any]:
    """The values that define the run: every field the plan varies, with this run's value (as written,
    `rate: '20mbit'`, plus the number, `rate_bit`), so runs of different cells compare on the same keys."""
    params: dict[str, Any] = {}
    if r.cell.arm is not None:
        params["arm"] = r.cell.arm
    written = {a.path: a.value for a in r.cell.assignments}
    for dotted, path in varied.items():
        try:
            value = get_in(r.run, path)
        except KeyError:
            continue   # e.g. a per-flow override of a flow this run does not have
        name = param_name(plan, dotted)
        params[name] = written.get(path, _plain(value))
        if isinstance(value, Quantity) and not isinstance(value.number, str):
            params[f"{name}_{value.suffix}"] = value.number
    return params


def run_seed(plan: Plan, key: str, repetition: int) -> int:
    """A per-run seed from the plan seed, the run's hash and the repetition (stable, recorded)."""
    text = f"{plan.seed}/{key}/{repetition}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:6], "big")


def topology_spec(plan: Plan) -> TopologySpec | None:
    """A stated topology as the run's; None for the default (RunSpec.testbed derives it from the roles)."""
    if plan.topology is None:
        return None
    g = plan_graph(plan.roles, plan.topology)
    return TopologySpec(hosts=list(g.hosts), switches=list(g.switches), links=list(g.links))


def _run_specs(plan: Plan, r: CellRun, varied: dict[str, KeyPath], a: Adaptation | None) -> list[RunSpec]:
    """The runs of one cell; with a profile, the cell's run adapted to the testbed (params stay the study's:
    they name the cell; derived values, hosts and flows are the adapted run's, the substitutions say how)."""
    t, key, extra = r.run, r.key, {}
    if a is not None:
        t, subs = a.run(r.run, r.cell.experiment)
        key = run_key(plan, r.cell, t, a.sha256)
    hosts = host_specs(t, plan.roles, plan.kernels if a is None else a.kernels)
    if a is not None:
        named = {k for role in plan.roles if (k := merged_host_section(t.hosts, role).kernel) is not None}
        extra = {"profile": ProfileRef(name=a.profile.name, sha256=a.sha256, scale_factor=a.factors[r.cell.experiment]),
                 "substitutions": a.kernel_substitutions(named) + subs}
    stats, interval = qdisc_stat_links(t)
    stem = "-".join([plan.name, r.cell.experiment] + ([r.cell.arm] if r.cell.arm else []) + [key])
    common: dict[str, Any] = dict(
        plan_name=plan.name, experiment=r.cell.experiment, tags=list(plan.tags), cell=r.cell.index,
        params=run_params(plan, r, varied),
        derived=derived_values(t), duration_s=t.duration.seconds, hosts=hosts,
        topology=topology_spec(plan),
        flows=flow_specs(t), captures=capture_points(t), qdisc_stats=stats, qdisc_stats_interval_ms=interval,
        tcp_probe=t.tcp_probe, ss_interval_ms=ss_interval_ms(t), ack_policy=ack_policy_spec(t), events=event_specs(t),
        kernel_trace=kernel_trace_spec(t),
        analysis=analysis_spec(t), accept_guards=list(t.accept_guards), **extra)
    return [RunSpec(run_id=f"{stem}-r{rep}", repetition=rep, seed=run_seed(plan, key, rep), **common)
            for rep in range(r.cell.repetitions)]


def order_runs(plan: Plan, per_cell: list[list[RunSpec]], order: str | None = None) -> list[RunSpec]:
    """`cells`: cell by cell; `rounds`: repetition 0 of every cell, then 1, ...; `random`: shuffled rounds."""
    order = order or plan.order
    if order == "cells":
        return [run for runs in per_cell for run in runs]
    rounds = max((len(runs) for runs in per_cell), default=0)
    out = []
    for rep in range(rounds):
        batch = [runs[rep] for runs in per_cell if rep < len(runs)]
        if order == "random":
            random.Random(plan.seed * 1_000_003 + rep).shuffle(batch)
        out += batch
    return out


def expand(plan: Plan, *, order: Literal["cells", "rounds", "random"] | None = None,
           profile: Profile | None = None) -> list[RunSpec]:
    """Every run of a checked plan (from `load_plan`, `load_plan_text` or `check_plan`; it is not checked
    again), in the plan's run order (or `order`), adapted to a testbed by `profile` if one is given."""
    varied = varied_fields(plan)
    cells = instantiate_all(plan)
    a = None if profile is None else adaptation(profile, plan.kernels, [(c.cell.experiment, c.run) for c in cells],
                                                plan_graph(plan.roles, plan.topology), plan.source_dir)
    return order_runs(plan, [_run_specs(plan, r, varied, a) for r in cells], order)
