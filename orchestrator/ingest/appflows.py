"""Routing of the app-limited flows' artifacts (pure apart from reading files): each flow's write log, its
sink's read log and its packets at the receiver-side capture become records.APP_WRITE rows
(orchestrator/ingest/applat.py). The receiver-side capture is one on the receiver itself if there is one,
else one toward the receiver (e.g. the bottleneck host's `aqm:to-receiver`, after its queue)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from orchestrator.ingest import applat
from orchestrator.ingest.applog import parse_read_log, parse_write_log
from orchestrator.ingest.pcap import PcapReader
from orchestrator.plan import RunSpec
from orchestrator.plan.expansion.runspec import FlowSpec
from orchestrator.storage import records

FLOW_PACKET = np.dtype([("ts_ns", "i8"), ("seq", "i8"), ("payload_len", "i4"), ("tcp_flags", "i2")])


class CaptureFile(Protocol):
    label: str
    host: str
    path: Path
    started_ns: int | None


def writer_log(run_dir: Path, f: FlowSpec) -> Path:
    return run_dir / f.src / f"app-writer-{f.port}.bin"


def sink_log(run_dir: Path, f: FlowSpec) -> Path:
    return run_dir / f.dst / f"app-sink-{f.port}.bin"


def writer_port(run_dir: Path, f: FlowSpec) -> int | None:
    """The writer's local port (its log's metadata), or None without a readable log."""
    try:
        return int(parse_write_log(writer_log(run_dir, f).read_bytes()).meta["local_port"])
    except (OSError, ValueError):
        return None


def receiver_side(captures: Sequence[CaptureFile], dst: str) -> CaptureFile | None:
    """The capture nearest the flow's receiver: on the receiver, else the first one toward it."""
    on_dst = [c for c in captures if c.host == dst]
    toward = [c for c in captures if c.label.endswith(f":to-{dst}")]
    return (on_dst or toward or [None])[0]


def flow_packets(chunks: Iterable[np.ndarray], ports: dict[tuple[int, int], int]) -> dict[int, np.ndarray]:
    """flow_id -> its TCP packets from the writer (src port, dst port) in capture order, narrow columns."""
    parts: dict[int, list[np.ndarray]] = {fid: [] for fid in ports.values()}
    for chunk in chunks:
        tcp = chunk[chunk["proto"] == records.PROTO_TCP]
        for (sport, dport), fid in ports.items():
            m = (tcp["src_port"] == sport) & (tcp["dst_port"] == dport)
            if m.any():
                part = np.empty(int(m.sum()), FLOW_PACKET)
                for n in FLOW_PACKET.names:
                    part[n] = tcp[n][m]
                parts[fid].append(part)
    return {fid: np.concatenate(p) if p else np.zeros(0, FLOW_PACKET) for fid, p in parts.items()}


def app_write_rows(spec: RunSpec, run_dir: Path, captures: Sequence[CaptureFile],
                   clock_offsets: dict[str, int]) -> list[tuple[int, np.ndarray]]:
    """(flow_id, APP_WRITE rows) of every app-limited flow whose writer left a log. A log the parser refuses
    raises ValueError naming the file."""
    out = []
    flows = [f for f in spec.flows if f.tool == "app_limited" and writer_log(run_dir, f).exists()]
    logs = {}
    for f in flows:
        path = writer_log(run_dir, f)
        try:
            logs[f.flow_id] = parse_write_log(path.read_bytes())
        except ValueError as exc:
            raise ValueError(f"{f.src}/{path.name}: {exc}") from exc
    by_capture: dict[str, list[FlowSpec]] = {}
    chosen = {f.flow_id: receiver_side(captures, f.dst) for f in flows}
    for f in flows:
        cap = chosen[f.flow_id]
        if cap is not None:
            by_capture.setdefault(cap.label, []).append(f)
    packets: dict[int, np.ndarray] = {}
    for label, group in by_capture.items():
        cap = next(c for c in captures if c.label == label)
        ports = {(int(logs[f.flow_id].meta["local_port"]), f.port): f.flow_id for f in group}
        packets.update(flow_packets(PcapReader(cap.path), ports))
    for f in flows:
        reads = None
        path = sink_log(run_dir, f)
        if path.exists():
            try:
                reads = parse_read_log(path.read_bytes()).rows
            except ValueError as exc:
                raise ValueError(f"{f.dst}/{path.name}: {exc}") from exc
        data = packets.get(f.flow_id, np.zeros(0, FLOW_PACKET))
        isn, _ = applat.isn_of(data["seq"], data["tcp_flags"], data["payload_len"])
        cap = chosen[f.flow_id]
        offsets = (clock_offsets.get(f.src, 0), clock_offsets.get(cap.host, 0) if cap else 0,
                   clock_offsets.get(f.dst, 0))
        since = cap.started_ns if cap is not None and cap.started_ns is not None else None
        out.append((f.flow_id, applat.app_writes(logs[f.flow_id].rows, data, isn, reads, offsets, since)))
    return out
