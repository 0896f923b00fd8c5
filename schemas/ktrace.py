"""Kernel-side timing collection (plan field `kernel_trace`, task `kernel_trace`): the names, bounds and the
artifact format the plan, the agent (agents/ktrace.py) and the ingest (orchestrator/ingest/ktrace.py) share.
Pure: every string the agent writes to tracefs is built here from validated fields (docs/security.md).

The artifact (one per host, `kernel-trace.txt`) is text in sections, each opened by a `#@` line:

    #@ tcplab-kernel-trace 1
    #@ probe <type id> <entry|return> <symbol>          one per kprobe/kretprobe event the agent created
    #@ offset <start|end> <CLOCK_REALTIME - CLOCK_MONOTONIC in ns>
    #@ section raw mono                                  the instance's buffer, options/raw: "pid cpu ts_ns type: ID"
    #@ section text mono                                 the same buffer as text (tracepoints, trace_printk)
    #@ section printk <clock>                            the top-level buffer (kernels without trace_printk_dest)
    #@ sync <start|end> <CLOCK_MONOTONIC ns>             a line `tcplab-sync <n>` the agent wrote to trace_marker
"""
from __future__ import annotations

import re

FORMAT_VERSION = 1
ARTIFACT_NAME = "kernel-trace.txt"
# a kernel symbol (kallsyms: letters, digits, `_`, `.` as in `foo.isra.0`)
SYMBOL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_.]{0,127}$"
# tracepoints are `system:event`; only these systems may be asked (and are reported in the capabilities)
TRACEPOINT_SYSTEMS = ("tcp", "timer", "net", "sock", "skb", "qdisc", "napi", "irq", "sched")
TRACEPOINT_PATTERN = r"^(" + "|".join(TRACEPOINT_SYSTEMS) + r"):[a-z][a-z0-9_]{0,63}$"
# a tracepoint filter (events/<sys>/<name>/filter): one line of field comparisons; no quotes or shell-ish bytes
FILTER_PATTERN = r"^[A-Za-z0-9_ =!<>&|()*.:+-]{1,256}$"
MAX_TRACEPOINTS = 16
MAX_KPROBES = 16
MIN_BUFFER_KIB = 1024
MAX_BUFFER_KIB = 262144           # per CPU
MAX_ARTIFACT_BYTES = 512 * 2**20  # per section read from tracefs: the agent stops reading there (meta `truncated`)
KRETPROBE_MAXACTIVE = 64          # concurrent returns a kretprobe tracks (nested / parallel calls)
EVENT_GROUP = "tcplab"
TRACER_FUNCTION_GRAPH = "function_graph"


def event_base(agent_pid: int, task_id: str) -> str:
    """The prefix of every dynamic event name of one task: unique per agent and task (hosts of the netns lab
    share one kernel, so agents must not collide), within the kernel's 64-character event names."""
    tag = re.sub(r"[^a-z0-9]", "", task_id.lower())[:16]
    return f"kt{int(agent_pid)}_{tag}"


def kprobe_event_names(base: str, index: int) -> tuple[str, str]:
    return f"{base}_{index}e", f"{base}_{index}r"


def kprobe_definitions(base: str, symbols: list[str]) -> list[tuple[str, str, str]]:
    """(event name, `kprobe_events` line that creates it, kind) for an entry/return pair per symbol."""
    out = []
    for i, sym in enumerate(symbols):
        if not re.fullmatch(SYMBOL_PATTERN, sym):
            raise ValueError(f"not a kernel symbol name: {sym!r}")
        entry, ret = kprobe_event_names(base, i)
        out.append((entry, f"p:{EVENT_GROUP}/{entry} {sym}", "entry"))
        out.append((ret, f"r{KRETPROBE_MAXACTIVE}:{EVENT_GROUP}/{ret} {sym}", "return"))
    return out


def kprobe_removal(name: str) -> str:
    return f"-:{EVENT_GROUP}/{name}"


def tracepoint_dir(name: str) -> str:
    """`timer:hrtimer_expire_entry` -> `events/timer/hrtimer_expire_entry` (relative to an instance)."""
    if not re.fullmatch(TRACEPOINT_PATTERN, name):
        raise ValueError(f"not an allowed tracepoint: {name!r}")
    system, event = name.split(":")
    return f"events/{system}/{event}"


def filter_text(expr: str) -> str:
    if not re.fullmatch(FILTER_PATTERN, expr):
        raise ValueError(f"not an allowed tracepoint filter: {expr!r}")
    return expr


def header_lines(probes: list[tuple[int, str, str]], offsets: list[tuple[str, int]]) -> list[str]:
    """The artifact's opening: version, the probe events (type id, kind, symbol), the clock offsets."""
    out = [f"#@ tcplab-kernel-trace {FORMAT_VERSION}\n"]
    out += [f"#@ probe {tid} {kind} {sym}\n" for tid, kind, sym in probes]
    out += [f"#@ offset {which} {int(v)}\n" for which, v in offsets]
    return out


SYNC_MARKER = "tcplab-sync"
