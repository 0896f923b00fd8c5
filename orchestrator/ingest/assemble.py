"""Turn one run's collected artifacts (results/<run-id>/<host>/...) into a RunIngest for the DB.

Pure apart from reading the files: parsers produce numpy arrays (records.py layouts); this module
routes each artifact to its parser and labels rows with host / capture point / flow. Captures are not
read here but handed over as streaming PcapReaders (the writer reads them chunk by chunk), except for
the per-packet queue delay: where a host captured both toward a flow's sender and toward its
receiver (the aqm), the data direction of both captures is streamed (narrow columns) and paired in
windows (orchestrator/ingest/qdelay_stream.py), its rows spooled to a temporary file.
"""
from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.engine import guards
from orchestrator.ingest import addr, qdelay, records
from orchestrator.ingest.conns import ConnRegistry
from orchestrator.ingest.iperf3 import parse_iperf3
from orchestrator.ingest.pcap import PcapReader
from orchestrator.ingest.qdelay_stream import pair_stream
from orchestrator.ingest.ss import parse_ss
from orchestrator.ingest.tcp_probe import parse_tcp_probe
from orchestrator.plan import RunSpec
from orchestrator.storage.ingest import RunIngest


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


def assemble(spec: RunSpec, run_row: dict, plan_row: dict | None, run_dir: Path,
             artifacts: dict[str, list[dict]], evidence: list[dict], flow_rows: list[dict],
             point_names: dict[tuple[str, str], str]) -> RunIngest:
    """artifacts: host -> list of ArtifactInfo dicts as the agents announced them."""
    probes, qdisc, iperf, ss, art_rows = [], [], [], [], []
    captures: list[_Capture] = []
    extra: dict[str, dict] = {}
    port_to_flow = {f.port: f.flow_id for f in spec.flows}
    for host, infos in artifacts.items():
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
                    captures.append(_Capture(len(captures), point, host, iface, path))
                    extra[point] = {"host": host, "interface": iface, **{k: meta.get(k) for k in CAPTURE_COUNTS}}
                elif kind == "tcp_probe":
                    probes.append((host, parse_tcp_probe(path.read_text(), trace_offset_ns(meta))))
                elif kind == "ss":
                    ss.append((host, parse_ss(path.read_text())))
                elif kind == "qdisc_stats":
                    iface = info["name"].removeprefix("qdisc-").removesuffix(".csv")
                    qdisc.append((host, iface, parse_qdisc_csv(path.read_text())))
                elif kind == "iperf3_client":
                    result = parse_iperf3(path.read_text())
                    port = int(info["name"].removeprefix("iperf3-client-").removesuffix(".json"))
                    iperf.append((port_to_flow[port], result.intervals))
            except ValueError as exc:  # a parser's format error names the line and why; add the file
                raise ArtifactError(f"{host}/{info['name']}: {exc}") from exc
    # guards on what was measured (M-DROP, G-NETEM/G-HTB post, G-CC post): here, so a re-ingest redoes them
    post = [str(f) for host, iface, arr in qdisc for f in guards.qdisc_findings(spec, host, iface, arr)]
    ports = {r["flow_id"]: r.get("src_port") for r in flow_rows}
    post += [str(f) for host, arr in ss for check in (guards.ss_cc_findings, guards.ss_sockbuf_findings)
             for f in check(spec, host, arr, ports)]
    run_row = {**run_row, "flags": list(dict.fromkeys([*run_row.get("flags", []), *post]))}
    conns = ConnRegistry()
    qd, pairs = paired_qdelay(spec, flow_rows, captures, conns)
    packets = [(c.label, PcapReader(c.path, c.point_id)) for c in captures]
    return RunIngest(run=run_row, plan=plan_row, flows=flow_rows, artifacts=art_rows, evidence=evidence,
                     packets=packets, capture_points=extra, conns=conns, qdelay=qd, qdelay_pairs=pairs,
                     tcp_probe=probes, qdisc_samples=qdisc, ss_samples=ss, iperf_intervals=iperf)


def sender_ports(run_dir: Path, spec: RunSpec) -> dict[int, int | None]:
    """flow_id -> the sender's local port of the data stream, from the iperf3 client JSON."""
    out: dict[int, int | None] = {}
    for f in spec.flows:
        path = run_dir / f.src / f"iperf3-client-{f.port}.json"
        streams = parse_iperf3(path.read_text()).streams if path.exists() else ()
        out[f.flow_id] = streams[0].sender_port if streams else None
    return out


INGEST_FILE = "ingest.json"


def save_ingest_inputs(run_dir: Path, run_row: dict, plan_row: dict | None, flow_rows: list[dict],
                       evidence: list[dict], artifacts: dict[str, list[dict]],
                       points: dict[tuple[str, str], str]) -> None:
    """Everything besides the artifact files that ingest needs, so the DB can be rebuilt from disk."""
    doc = {"run": run_row, "plan": plan_row, "flows": flow_rows, "evidence": evidence, "artifacts": artifacts,
           "points": [[h, i, p] for (h, i), p in points.items()]}
    (run_dir / INGEST_FILE).write_text(json.dumps(doc, indent=1, default=_iso))


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def reassemble(run_dir: Path) -> RunIngest:
    """Rebuild a run's RunIngest from results/<run-id>/ (the artifacts plus ingest.json)."""
    doc = json.loads((run_dir / INGEST_FILE).read_text())
    spec = RunSpec.model_validate(doc["run"]["spec"])
    run_row = dict(doc["run"])
    for key in ("started_at", "finished_at"):
        if run_row.get(key):
            run_row[key] = dt.datetime.fromisoformat(run_row[key])
    plan_row = dict(doc["plan"]) if doc["plan"] else None
    if plan_row and plan_row.get("created_at"):
        plan_row["created_at"] = dt.datetime.fromisoformat(plan_row["created_at"])
    points = {(h, i): p for h, i, p in doc["points"]}
    if run_row["status"] != "complete":
        return RunIngest(run=run_row, plan=plan_row, flows=doc["flows"], evidence=doc["evidence"])
    return assemble(spec, run_row, plan_row, run_dir, doc["artifacts"], doc["evidence"], doc["flows"], points)
