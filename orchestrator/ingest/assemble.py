"""Turn one run's collected artifacts (results/<run-id>/<host>/...) into a RunIngest for the DB.

Pure apart from reading the files: parsers produce numpy arrays (records.py layouts); this module
only routes each artifact to its parser and labels rows with host / capture point / flow.
"""
from __future__ import annotations

import csv
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.ingest import records
from orchestrator.ingest.iperf3 import parse_iperf3
from orchestrator.ingest.pcap import read_pcap
from orchestrator.ingest.tcp_probe import parse_tcp_probe
from orchestrator.plan.runspec import RunSpec
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


def assemble(spec: RunSpec, run_row: dict, plan_row: dict | None, run_dir: Path,
             artifacts: dict[str, list[dict]], evidence: list[dict], flow_rows: list[dict],
             point_names: dict[tuple[str, str], str]) -> RunIngest:
    """artifacts: host -> list of ArtifactInfo dicts as the agents announced them."""
    packets, probes, qdisc, iperf, art_rows = [], [], [], [], []
    port_to_flow = {f.port: f.flow_id for f in spec.flows}
    for host, infos in artifacts.items():
        for info in infos:
            path = run_dir / host / info["name"]
            art_rows.append({"host": host, "name": info["name"], "kind": info["kind"],
                             "path": str(path), "size": info["size"], "sha256": info["sha256"],
                             "meta": info.get("meta", {})})
            kind, meta = info["kind"], info.get("meta", {})
            if kind == "pcap":
                point = point_names.get((host, meta.get("interface", "")), f"{host}:{meta.get('interface')}")
                packets.append((point, read_pcap(path)))
            elif kind == "tcp_probe":
                probes.append((host, parse_tcp_probe(path.read_text(), trace_offset_ns(meta))))
            elif kind == "qdisc_stats":
                iface = info["name"].removeprefix("qdisc-").removesuffix(".csv")
                qdisc.append((host, iface, parse_qdisc_csv(path.read_text())))
            elif kind == "iperf3_client":
                result = parse_iperf3(path.read_text())
                port = int(info["name"].removeprefix("iperf3-client-").removesuffix(".json"))
                iperf.append((port_to_flow[port], result.intervals))
    return RunIngest(run=run_row, plan=plan_row, flows=flow_rows, artifacts=art_rows, evidence=evidence,
                     packets=packets, tcp_probe=probes, qdisc_samples=qdisc, iperf_intervals=iperf)


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
