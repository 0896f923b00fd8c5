"""The run template's `kernel_trace:` section: kernel-side timing collected on some hosts (docs/plans.md#kernel_trace).

Typed and bounded entries only: roles, `system:event` tracepoints of the allowed systems with an optional
filter, kernel symbols timed per call (kprobe + kretprobe), trace_printk lines, a buffer size. Runs with it are
timing runs (G-PROBE): the plan must be tagged `timing` and no performance metric is reported from them.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, StringConstraints

from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.names import RoleName
from orchestrator.plan.model.quantities import PositiveSize
from schemas import ktrace

TracepointName = Annotated[str, StringConstraints(pattern=ktrace.TRACEPOINT_PATTERN)]
SymbolName = Annotated[str, StringConstraints(pattern=ktrace.SYMBOL_PATTERN)]


def _named(key: str):
    """A bare string stands for `{key: string}` (`- tcp_write_xmit` = `- {symbol: tcp_write_xmit}`)."""
    def to_mapping(v: object) -> object:
        return {key: v} if isinstance(v, str) else v
    return BeforeValidator(to_mapping)


class TracepointSel(Strict):
    """One tracepoint, recorded with its fields as text on every hit."""

    name: TracepointName = _f(..., "`system:event`; systems: " + ", ".join(ktrace.TRACEPOINT_SYSTEMS),
                              "timer:hrtimer_expire_entry")
    filter: Annotated[str, StringConstraints(pattern=ktrace.FILTER_PATTERN)] | None = _f(
        None, "the kernel's event filter (events/<system>/<event>/filter): field comparisons joined by && and ||",
        "function == 0xffffffff81234560")


class FunctionTiming(Strict):
    """One kernel function timed per call: duration_ns = return - entry."""

    symbol: SymbolName = _f(..., "kernel symbol (as in /proc/kallsyms)", "tcp_write_xmit")
    method: Literal["kprobe", "function_graph"] = _f(
        "kprobe", "kprobe: a kprobe + kretprobe pair (needs kprobe_events); function_graph: the tracer's "
        "durations (not executed by this agent version: refused at preflight)", "kprobe")


class KernelTrace(Strict):
    """Kernel-side timing on some hosts, one artifact per host (table kernel_trace)."""

    hosts: list[RoleName] = _f(..., "roles whose kernel is traced", ["sender"], min_length=1, max_length=32)
    trace_printk: bool = _f(False, "collect trace_printk lines (a kernel or module built with timing probes); "
                            "a line `<name> ... <n> ns` gives <n> as the value of event <name>", True)
    tracepoints: list[Annotated[TracepointSel, _named("name")]] = _f(
        [], "tracepoints to record, each `system:event` or {name, filter}", ["timer:hrtimer_expire_entry"],
        max_length=ktrace.MAX_TRACEPOINTS)
    functions: list[Annotated[FunctionTiming, _named("symbol")]] = _f(
        [], "kernel functions timed per call, each a symbol or {symbol, method}", ["tcp_write_xmit"],
        max_length=ktrace.MAX_KPROBES)
    buffer: PositiveSize = _f("16MiB", "ring buffer per CPU (1 MiB to 256 MiB); events past it are lost "
                              "(the overrun is counted)", "16MiB", validate_default=True)
