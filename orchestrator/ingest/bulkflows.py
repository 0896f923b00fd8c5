"""The `bulk` flows' logs (pure apart from reading files): the sender's JSON log (agents/bulksend.py) gives each
flow's local port; its sink's read log (agents/appwriter.py `sink`, read by applog.parse_read_log) its goodput
and, for a byte-limited flow, its completion time. Times of the sink's host are brought to the manager's clock
with that host's measured offset (assemble.clock_offsets), as M-STARTSKEW does.

Per flow (the flow row's columns, None where unknown):
  sink_bytes        bytes the sink read
  sink_goodput_bps  sink_bytes x 8 / (the sink's last read - the flow's scheduled start)
  fct_ns            a byte-limited flow: the sink's read of its last byte - the flow's scheduled start (M-FCT
                    of a pre-connected flow: its SYN is before T0, so the start is the scheduled one)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.ingest.appflows import sink_log
from orchestrator.ingest.applog import parse_read_log
from orchestrator.plan import RunSpec
from orchestrator.plan.expansion.runspec import FlowSpec

LOG_FORMAT = "tcplab-bulk-log 1"      # agents/bulksend.LOG_FORMAT
FLOW_KEYS = ("port", "local_port", "sent", "first_send_ns", "last_byte_ns", "error")
FLOW_COLUMNS = ("sink_bytes", "sink_goodput_bps", "fct_ns")


def parse_bulk_log(text: str) -> dict[int, dict[str, Any]]:
    """port -> that flow's entry of a bulk sender's log, with the release instant it was given (`instant_ns`,
    the sender host's clock, as its `first_send_ns`). ValueError naming what is wrong."""
    try:
        log = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(log, dict) or log.get("format") != LOG_FORMAT:
        raise ValueError(f"not a bulk sender log: `format` is not {LOG_FORMAT!r}")
    flows = log.get("flows")
    if not isinstance(log.get("first_ns"), int):
        raise ValueError("`first_ns` (the release instant) is not an integer")
    if not isinstance(flows, list) or not flows:
        raise ValueError("`flows` is not a non-empty list")
    out = {}
    for i, f in enumerate(flows):
        missing = [k for k in FLOW_KEYS if not isinstance(f, dict) or k not in f]
        if missing:
            raise ValueError(f"flows[{i}] has no {', '.join(missing)}")
        out[int(f["port"])] = {**f, "instant_ns": log["first_ns"]}
    return out


def sender_logs(run_dir: Path, spec: RunSpec) -> dict[int, dict[str, Any]]:
    """flow_id -> its entry in its sender's log, for every bulk flow whose sender left one. A log the parser
    refuses raises ValueError naming the host and file."""
    by_host: dict[str, dict[int, dict]] = {}
    for host in sorted({f.src for f in spec.flows if f.tool == "bulk"}):
        by_host[host] = {}
        for path in sorted((run_dir / host).glob("bulk-send-*.json")):
            try:
                by_host[host].update(parse_bulk_log(path.read_text()))
            except ValueError as exc:
                raise ValueError(f"{host}/{path.name}: {exc}") from exc
    return {f.flow_id: by_host[f.src][f.port] for f in spec.flows
            if f.tool == "bulk" and f.port in by_host.get(f.src, {})}


def sender_port(f: FlowSpec, logs: dict[int, dict[str, Any]]) -> int | None:
    """The flow's local port from its sender's log (sender_logs), or None."""
    entry = logs.get(f.flow_id)
    return int(entry["local_port"]) if entry and entry["local_port"] else None


def sink_values(f: FlowSpec, read_ts: Any, read_end: Any, scheduled_ns: int | None, offset_ns: int) -> dict:
    """The flow's FLOW_COLUMNS from its sink's reads (the log's t_ns and end columns, in the sink host's clock)."""
    out: dict[str, Any] = dict.fromkeys(FLOW_COLUMNS)
    if not len(read_end):
        return out
    total, last_ns = int(read_end[-1]), int(read_ts[-1]) - offset_ns
    out["sink_bytes"] = total
    if scheduled_ns is not None and last_ns > scheduled_ns:
        out["sink_goodput_bps"] = total * 8e9 / (last_ns - scheduled_ns)
        if f.bytes is not None and total >= f.bytes:
            done = int(read_ts[int((read_end >= f.bytes).argmax())]) - offset_ns
            out["fct_ns"] = done - scheduled_ns
    return out


def bulk_flow_values(spec: RunSpec, run_dir: Path, t0_ns: int | None,
                     offsets: dict[str, int]) -> dict[int, dict[str, Any]]:
    """flow_id -> FLOW_COLUMNS for every flow (None for the other tools and where a sink left no log)."""
    out = {f.flow_id: dict.fromkeys(FLOW_COLUMNS) for f in spec.flows}
    for f in (f for f in spec.flows if f.tool == "bulk"):
        path = sink_log(run_dir, f)
        if not path.exists():
            continue
        try:
            reads = parse_read_log(path.read_bytes()).rows
        except ValueError as exc:
            raise ValueError(f"{f.dst}/{path.name}: {exc}") from exc
        scheduled = t0_ns + int(f.start_s * 1e9) if t0_ns is not None else None
        out[f.flow_id] = sink_values(f, reads["t_ns"], reads["end"], scheduled, int(offsets.get(f.dst, 0)))
    return out
