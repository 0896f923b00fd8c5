"""Turn one run's collected artifacts (results/<run-id>/<host>/...) into a RunIngest for the DB.

Pure apart from reading the files, and nothing but parsing and routing: parsers produce numpy arrays
(records.py layouts); this module routes each artifact to its parser and labels rows with host / capture
point / flow. Judging what was measured is the guards' business (orchestrator/guards/finalise.py). Captures are not
read here but handed over as streaming PcapReaders (the writer reads them chunk by chunk), except for
the per-packet queue delay: where a host captured both toward a flow's sender and toward its
receiver (the aqm), the data direction of both captures is streamed (narrow columns) and paired in
windows (orchestrator/ingest/qdelay_stream.py), its rows spooled to a temporary file.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.ingest import egress_qdelay as egress
from orchestrator.ingest import qdelay
from orchestrator.ingest.appflows import app_write_rows, writer_port
from orchestrator.ingest.bulkflows import bulk_flow_values, sender_logs, sender_port
from orchestrator.ingest.cpu import CpuSamples, parse_cpu
from orchestrator.ingest.events import parse_event_record
from orchestrator.ingest.hosts import host_rows
from orchestrator.ingest.iperf3 import parse_iperf3
from orchestrator.ingest.ktrace import parse_kernel_trace
from orchestrator.ingest.pcap import PcapReader
from orchestrator.ingest.qdelay_stream import pair_stream
from orchestrator.ingest.record import RunRecord
from orchestrator.ingest.ss import parse_ss
from orchestrator.ingest.tcp_probe import parse_tcp_probe
from orchestrator.plan import RunSpec
from orchestrator.storage import addr, records
from orchestrator.storage.conns import ConnRegistry
from orchestrator.storage.run_ingest import RunIngest


def parse_qdisc_csv(text: str) -> np.ndarray:
    rows = list(csv.DictReader(io.StringIO(text)))
    out = np.zeros(len(rows), dtype=records.QDISC_SAMPLE)
    for name in records.QDISC_SAMPLE.names:
        out[name] = [r[name] for r in rows]
    return out


def trace_offset_ns(meta: dict[str, Any]) -> int:
    """Trace clock -> CLOCK_REALTIME: mean of the offsets sampled at start and end of tracing."""
    return (int(meta["offset_start_ns"]) + int(meta["offset_end_ns"])) // 2


# Narrow columns of the data direction, for pairing (addresses are fixed by the direction).
_QKEY = np.dtype([(n, records.PACKET.fields[n][0]) for n in
                  ("ts_ns", "proto", "ipv", "src_port", "dst_port", "seq", "ip_id", "payload_len", "tsval", "ecn")]
                 + [("conn_id", "i4")])
CAPTURE_COUNTS = ("captured", "received_by_filter", "dropped_by_kernel")


@dataclass(frozen=True)
class _Capture:
    point_id: int
    label: str
    host: str
    interface: str
    path: Path
    started_ns: int | None = None   # when tcpdump said it was listening (the capture host's clock)


def _direction_chunks(cap: _Capture, src: np.void, dst: np.void, conns: ConnRegistry) -> Iterator[np.ndarray]:
    """The capture's packets from src to dst as narrow _QKEY chunks, streamed in capture order."""
    for chunk in PcapReader(cap.path, cap.point_id):
        ids = conns.ids(chunk)
        m = qdelay.direction(chunk, src, dst)
        part = np.empty(int(m.sum()), _QKEY)
        for n in _QKEY.names[:-1]:
            part[n] = chunk[n][m]
        part["conn_id"] = ids[m]
        yield part



def netem_delay_ns(spec: RunSpec, host: str, toward: str) -> int:
    """Constant netem delay on a host's interface toward a role (0 without netem)."""
    plan = spec.hosts.get(host)
    stages = plan.qdiscs.get(toward, []) if plan is not None else []
    return sum(int(getattr(s, "delay_ns", 0)) for s in stages if getattr(s, "kind", "") == "netem")


_EGRESS = np.dtype([("ts_ns", "i8"), ("ip_len", "i4"), ("payload_len", "i4"), ("ecn", "i2"), ("conn_id", "i4")])


def egress_qdelay(spec: RunSpec, flow_rows: list[dict], captures: list[_Capture], conns: ConnRegistry,
                  traces: list[tuple[str, str, np.ndarray]]) -> tuple[list[tuple[str, np.ndarray]], list[dict]]:
    """QDELAY arrays and qdelay_pair rows from each queue trace (host, interface, events) and the capture on the
    same interface (M-QDELAY method (a), orchestrator/ingest/egress_qdelay.py)."""
    by_iface = {(c.host, c.interface): c for c in captures}
    out, pairs = [], []
    for host, iface, events in traces:
        cap = by_iface.get((host, iface))
        if cap is None:
            continue
        toward = cap.label.removeprefix(f"{host}:to-")
        ends = {(r["src_addr"], r["dst_addr"]): (addr.packed(r["src_addr"]), addr.packed(r["dst_addr"]))
                for r in flow_rows if r["src_host"] == host and r["dst_host"] == toward}
        parts = []
        for chunk in PcapReader(cap.path, cap.point_id):
            ids, m = conns.ids(chunk), np.zeros(len(chunk), bool)
            for src, dst in ends.values():
                m |= qdelay.direction(chunk, src, dst)
            part = np.empty(int(m.sum()), _EGRESS)
            for n in _EGRESS.names[:-1]:
                part[n] = chunk[n][m]
            part["conn_id"] = ids[m]
            parts.append(part)
        packets = np.concatenate(parts) if parts else np.empty(0, _EGRESS)
        packets = packets[np.argsort(packets["ts_ns"], kind="stable")]
        soj = egress.trace_xmits(events)
        netem = netem_delay_ns(spec, host, toward)
        rows, unmatched = egress.attach(soj.rows, packets, netem)
        out.append((cap.label, rows))
        pairs.append({"ingress": f"{host}:{iface} net_dev_queue", "egress": cap.label, "d_fwd_ns": 0,
                      "d_fwd_source": "tracepoints", "netem_ns": netem, "matched": int(rows.size),
                      "dropped": soj.dropped, "ce": int(rows["ce"].sum()), "unmatched_egress": unmatched})
    return out, pairs


def paired_qdelay(spec: RunSpec, flow_rows: list[dict], captures: list[_Capture],
                  conns: ConnRegistry) -> tuple[list[tuple[str, np.ndarray]], list[dict]]:
    """QDELAY arrays and qdelay_pair rows for every host that captured toward both ends of a flow."""
    by_point = {c.label: c for c in captures}
    out, pairs = [], []
    directions = sorted({(f.src, f.dst) for f in spec.flows})
    addrs = {(r["src_host"], r["dst_host"]): (r["src_addr"], r["dst_addr"]) for r in flow_rows}
    for src, dst in directions:
        if (src, dst) not in addrs:
            continue
        for host in sorted({c.link.host for c in spec.captures} - {src, dst}):
            ing, egr = by_point.get(f"{host}:to-{src}"), by_point.get(f"{host}:to-{dst}")
            if ing is None or egr is None:
                continue
            s_addr, d_addr = (addr.packed(a) for a in addrs[(src, dst)])
            # Streamed in windows, rows spooled to disk: memory does not grow with the run length.
            result = pair_stream(_direction_chunks(ing, s_addr, d_addr, conns),
                                 _direction_chunks(egr, s_addr, d_addr, conns),
                                 netem_ns=netem_delay_ns(spec, host, dst))
            out.append((ing.label, result.rows))
            pairs.append(result.summary(ing.label, egr.label))
    return out, pairs


class ArtifactError(ValueError):
    """An artifact the parsers refuse: names the host/file and, through the parser, the line and why."""


def assemble(spec: RunSpec, record: RunRecord, run_dir: Path) -> RunIngest:
    """The RunIngest of a complete run: every artifact the agents announced, parsed and labelled. Raises
    ArtifactError naming the host, file and (through the parser) the line a parser refused."""
    flow_rows, point_names = record.flows, record.points
    probes, qdisc, iperf, ss, art_rows, ktrace, events, queue_traces = [], [], [], [], [], [], [], []
    captures: list[_Capture] = []
    extra: dict[str, dict] = {}
    port_to_flow = {f.port: f.flow_id for f in spec.flows}
    for host, infos in record.artifacts.items():
        for info in infos:
            path = run_dir / host / info["name"]
            art_rows.append({"host": host, "name": info["name"], "kind": info["kind"],
                             "path": str(path), "size": info["size"], "sha256": info["sha256"],
                             "meta": info.get("meta", {})})
            try:
                kind, meta = info["kind"], info.get("meta", {})
                if kind == "pcap":
                    iface = meta.get("interface", "")
                    point = point_names.get((host, iface), f"{host}:{iface}")
                    captures.append(_Capture(len(captures), point, host, iface, path, meta.get("started_ns")))
                    extra[point] = {"host": host, "interface": iface, **{k: meta.get(k) for k in CAPTURE_COUNTS}}
                elif kind == "tcp_probe":
                    probes.append((host, parse_tcp_probe(path.read_text(), trace_offset_ns(meta))))
                elif kind == "queue_trace":
                    iface = info["name"].removeprefix("queue-trace-").removesuffix(".trace")
                    queue_traces.append((host, iface, egress.parse_queue_trace(path.read_text(),
                                                                                trace_offset_ns(meta))))
                elif kind == "ss":
                    ss.append((host, parse_ss(path.read_text())))
                elif kind == "qdisc_stats":
                    iface = info["name"].removeprefix("qdisc-").removesuffix(".csv")
                    qdisc.append((host, iface, parse_qdisc_csv(path.read_text())))
                elif kind == "kernel_trace":
                    asked = list(spec.kernel_trace.tracepoints) if spec.kernel_trace else []
                    ktrace.append((host, parse_kernel_trace(path.read_bytes(), asked)))
                elif kind == "event":
                    events.append(parse_event_record(path.read_text(), host))
                elif kind == "iperf3_client":
                    result = parse_iperf3(path.read_text())
                    port = int(info["name"].removeprefix("iperf3-client-").removesuffix(".json"))
                    iperf.append((port_to_flow[port], result.intervals))
            except ValueError as exc:  # a parser's format error names the line and why; add the file
                raise ArtifactError(f"{host}/{info['name']}: {exc}") from exc
    try:
        app_writes = app_write_rows(spec, run_dir, captures, clock_offsets(record))
        bulk = bulk_flow_values(spec, run_dir, record.run.get("t0_ns"), clock_offsets(record))
        bulk_sends = sender_logs(run_dir, spec)   # a bulk sender's log the parser refuses fails the ingest, named
    except ValueError as exc:   # names the host and file
        raise ArtifactError(str(exc)) from exc
    flow_rows = [{**r, **bulk.get(r["flow_id"], {})} for r in flow_rows]
    conns = ConnRegistry()
    qd, pairs = paired_qdelay(spec, flow_rows, captures, conns)
    more, more_pairs = egress_qdelay(spec, flow_rows, captures, conns, queue_traces)
    qd, pairs = qd + more, pairs + more_pairs
    packets = [(c.label, PcapReader(c.path, c.point_id)) for c in captures]
    return RunIngest(run=record.run, plan=record.plan, flows=flow_rows, artifacts=art_rows, evidence=record.evidence,
                     hosts=host_rows(spec, record.evidence), packets=packets, capture_points=extra, conns=conns,
                     events=events, qdelay=qd, qdelay_pairs=pairs,
                     tcp_probe=probes, qdisc_samples=qdisc, ss_samples=ss, iperf_intervals=iperf,
                     kernel_trace=ktrace, app_writes=app_writes, bulk_sends=bulk_sends)


def measured_clock_offsets(record: RunRecord) -> dict[str, int]:
    """host -> its clock offset from the manager (ns) as the engine measured it before the run."""
    return {e["host"]: int(e["data"]["offset_ns"]) for e in record.evidence if e["phase"] == "clock"}


def clock_offsets(record: RunRecord) -> dict[str, int]:
    """host -> its clock offset from the manager (ns), measured before the run (G-CLOCK). Hosts on one kernel
    (the same boot_id: the netns lab) share one clock: they get one offset, the median of their measurements,
    so that measurement noise does not enter times subtracted across them."""
    measured = measured_clock_offsets(record)
    boot = {e["host"]: (e["data"].get("capabilities") or {}).get("boot_id") or e["host"]
            for e in record.evidence if e["phase"] == "hello"}
    groups: dict[str, list[int]] = {}
    for host, off in measured.items():
        groups.setdefault(boot.get(host, host), []).append(off)
    return {host: int(np.median(groups[boot.get(host, host)])) for host in measured}


def sender_ports(run_dir: Path, spec: RunSpec) -> dict[int, int | None]:
    """flow_id -> the sender's local port of the data stream, from the iperf3 client JSON (an app-limited
    flow: its writer's log; a bulk flow: its sender's log)."""
    out: dict[int, int | None] = {}
    try:
        bulk = sender_logs(run_dir, spec)
    except ValueError:   # assemble names the log the parser refuses
        bulk = {}
    for f in spec.flows:
        if f.tool == "app_limited":
            out[f.flow_id] = writer_port(run_dir, f)
            continue
        if f.tool == "bulk":
            out[f.flow_id] = sender_port(f, bulk)
            continue
        path = run_dir / f.src / f"iperf3-client-{f.port}.json"
        try:
            streams = parse_iperf3(path.read_text()).streams if path.exists() else ()
        except (ValueError, OSError):   # no port: the ingest names the artifact's fault and keeps the run
            streams = ()
        out[f.flow_id] = streams[0].sender_port if streams else None
    return out


def cpu_samples(record: RunRecord, run_dir: Path) -> Iterator[tuple[str, str, CpuSamples | ValueError | OSError]]:
    """(host, artifact name, parsed samples or the reason they cannot be read) of every cpu_load artifact;
    read apart from `assemble` because a failed run's CPU load is worth judging too."""
    for host, infos in record.artifacts.items():
        for info in (i for i in infos if i["kind"] == "cpu"):
            try:
                yield host, info["name"], parse_cpu((run_dir / host / info["name"]).read_text())
            except (OSError, ValueError) as exc:
                yield host, info["name"], exc
