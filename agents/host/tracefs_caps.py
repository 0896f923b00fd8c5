"""What tracefs offers for kernel_trace (docs/plans.md#kernel_trace): tracepoints of the allowed systems,
kprobe_events, the tracers, whether an instance can take trace_printk output. Read, never written."""
from __future__ import annotations

from pathlib import Path

from schemas.ktrace import TRACEPOINT_SYSTEMS


def tracepoints(root: Path | None) -> list[str]:
    """`system:event` for every event directory of the allowed systems (a few hundred at most)."""
    if root is None:
        return []
    out = []
    for system in TRACEPOINT_SYSTEMS:
        d = root / "events" / system
        if d.is_dir():
            out += [f"{system}:{e.name}" for e in sorted(d.iterdir()) if (e / "enable").exists()]
    return out


def tracers(root: Path | None) -> list[str]:
    try:
        return (root / "available_tracers").read_text().split() if root else []
    except OSError:
        return []


def kprobe_events(root: Path | None) -> bool:
    return root is not None and (root / "kprobe_events").exists()


def trace_printk_dest(root: Path | None) -> bool:
    """Instances have the option trace_printk_dest (Linux 6.12+): trace_printk can go to a private instance."""
    return root is not None and (root / "options" / "trace_printk_dest").exists()
