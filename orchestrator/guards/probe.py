"""G-PROBE (docs/guards.md#g-probe): a run that traced the kernel (kernel_trace) is a timing run. Its probes slow
what they time, so it carries this flag and the report takes no performance number from it (analysis/kernel_cost.py
is_timing_run): only its kernel cost table (M-KCOST)."""
from __future__ import annotations

from orchestrator.plan import RunSpec
from schemas.flag import Flag


def probe_flags(spec: RunSpec) -> list[Flag]:
    k = spec.kernel_trace
    if k is None:
        return []
    functions = k.kprobes + k.function_graph
    what = [w for w, on in (("trace_printk", k.trace_printk),
                            (f"tracepoints {', '.join(k.tracepoints)}", bool(k.tracepoints)),
                            (f"function timings {', '.join(functions)}", bool(functions))) if on]
    return [Flag(guard="G-PROBE", host="+".join(k.hosts), message=f"timing run: {'; '.join(what)} traced; no "
                 "performance metric is reported from it", evidence={"hosts": list(k.hosts)})]
