"""Rules of the `kernel_trace:` section (docs/plans.md#kernel_trace): known roles, no repeats, bounded buffer;
and plan-wide, the `timing` tag of timing runs (G-PROBE)."""
from __future__ import annotations

from orchestrator.plan.checks.errors import Problem
from orchestrator.plan.model.template import RunTemplate
from schemas import ktrace

TIMING_TAG = "timing"


def kernel_trace_problems(t: RunTemplate, roles: list[str]) -> list[Problem]:
    k = t.kernel_trace
    if k is None:
        return []
    out = []
    base = ("kernel_trace",)
    for i, role in enumerate(k.hosts):
        if role not in roles:
            out.append(Problem(base + ("hosts", i), f"unknown role {role!r} (roles: {', '.join(roles)})"))
        elif role in k.hosts[:i]:
            out.append(Problem(base + ("hosts", i), f"role {role!r} is listed twice"))
    for what, names in (("tracepoints", [tp.name for tp in k.tracepoints]),
                        ("functions", [f.symbol for f in k.functions])):
        out += [Problem(base + (what, i), f"{name} is listed twice") for i, name in enumerate(names)
                if name in names[:i]]
    kib = k.buffer.value // 1024
    if not ktrace.MIN_BUFFER_KIB <= kib <= ktrace.MAX_BUFFER_KIB or k.buffer.value % 1024:
        out.append(Problem(base + ("buffer",), f"the trace buffer is whole KiB from {ktrace.MIN_BUFFER_KIB // 1024} "
                           f"MiB to {ktrace.MAX_BUFFER_KIB // 1024} MiB per CPU"))
    if not (k.trace_printk or k.tracepoints or k.functions):
        out.append(Problem(base, "nothing to collect: ask for trace_printk, tracepoints or functions"))
    return out


def sets_kernel_trace(keys) -> bool:
    return any(str(key).split(".")[0] == "kernel_trace" for key in keys)


def timing_tag_problems(plan) -> list[Problem]:
    """A plan whose runs trace the kernel makes timing runs: tagged `timing`, no performance metric (G-PROBE)."""
    traced = plan.run.kernel_trace is not None or sets_kernel_trace(
        [k for a in plan.arms for k in a.set] + [k for e in plan.experiments for k in e.set])
    if traced and TIMING_TAG not in plan.tags:
        return [Problem(("tags",), "runs with kernel_trace are timing runs: tag the plan `timing` (G-PROBE: probes "
                        "slow what they time, so no performance metric may come from these runs)")]
    return []
