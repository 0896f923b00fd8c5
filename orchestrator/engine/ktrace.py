"""kernel_trace in the run engine: the agent task it becomes (bind) and what a host must have for it (preflight)."""
from __future__ import annotations

from orchestrator.plan.expansion.runspec import KernelTraceSpec
from schemas import ktrace, protocol


def kernel_trace_task(k: KernelTraceSpec, start_ns: int, stop_ns: int) -> protocol.KernelTraceTask:
    return protocol.KernelTraceTask(
        task_id="kernel-trace", start_ns=start_ns, stop_ns=stop_ns, trace_printk=k.trace_printk,
        tracepoints=list(k.tracepoints), filters={n: f for n, f in k.tracepoints.items() if f is not None},
        kprobes=list(k.kprobes), buffer_kib=k.buffer_kib)


def kernel_trace_problems(k: KernelTraceSpec | None, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """What a traced host lacks, naming host, kernel and the missing piece: kprobe_events for function timings,
    each asked tracepoint (checked by name against the ones the agent found in tracefs)."""
    if k is None:
        return []
    out = []
    for role in k.hosts:
        c = caps.get(role)
        if c is None:
            continue
        where = f"host {role} (kernel {c.kernel_release})"
        if k.kprobes and not c.kprobe_events:
            out.append(f"{where} lacks kprobe_events (CONFIG_KPROBE_EVENTS): kernel_trace.functions "
                       f"{', '.join(k.kprobes)} cannot be timed by kprobe/kretprobe pairs")
        missing = [tp for tp in k.tracepoints if tp not in c.tracepoints]
        if missing:
            out.append(f"{where} lacks tracepoint{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                       f"(no events/{missing[0].replace(':', '/')} in tracefs)")
    return out


def kernel_trace_unsupported(k: KernelTraceSpec | None, caps: dict[str, protocol.Capabilities]) -> list[str]:
    """Asked, and not executed by this agent version: function timing by the function_graph tracer."""
    if k is None or not k.function_graph:
        return []
    has = {role: ktrace.TRACER_FUNCTION_GRAPH in caps[role].tracers for role in k.hosts if role in caps}
    return [f"kernel_trace.functions {', '.join(k.function_graph)} with method function_graph: not executed by this "
            f"agent version (use method kprobe; host {role} {'has' if ok else 'lacks'} the function_graph tracer)"
            for role, ok in has.items()]
