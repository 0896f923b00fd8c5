"""Rules of an app-limited (thin-stream) flow group: the writer's bounds (schemas/limits.py), checked where the
researcher sets them, so a plan the agents would refuse is refused at load."""
from __future__ import annotations

from orchestrator.plan.checks.errors import Problem
from orchestrator.plan.model.paths import KeyPath
from orchestrator.plan.model.traffic import Traffic
from orchestrator.plan.model.units import format_time_ns
from schemas import limits


def app_limited_problems(gp: KeyPath, tr: Traffic, run_ns: int) -> list[Problem]:
    """Problems of one traffic group's write_size / write_interval / write_interval_dist."""
    out = []
    if tr.tool != "app_limited":
        if tr.write_interval_dist is not None:
            out.append(Problem(gp + ("write_interval_dist",), f"`write_interval_dist` has no meaning for tool "
                               f"{tr.tool}"))
        return out
    if tr.write_size is not None and tr.write_size.value > limits.MAX_APP_WRITE_BYTES:
        out.append(Problem(gp + ("write_size",), f"a write of {tr.write_size.value} bytes exceeds the writer's "
                           f"limit of {limits.MAX_APP_WRITE_BYTES} bytes"))
    if tr.write_interval is None:
        return out
    interval = tr.write_interval.value
    if interval < limits.MIN_APP_WRITE_INTERVAL_NS:
        out.append(Problem(gp + ("write_interval",), f"write_interval {format_time_ns(interval)} is shorter "
                           f"than the writer can keep ({format_time_ns(limits.MIN_APP_WRITE_INTERVAL_NS)})"))
        return out
    span = tr.duration.value if tr.duration is not None else run_ns
    if span // interval > limits.MAX_APP_WRITES:
        out.append(Problem(gp + ("write_interval",), f"{span // interval} writes of one flow (every "
                           f"{format_time_ns(interval)} for {format_time_ns(span)}) exceed the writer's limit "
                           f"of {limits.MAX_APP_WRITES}"))
    return out
