"""finalise_run: the one ending of every run, for the run engine and for `tcplab ingest` alike.

From a RunRecord (what the engine saved as ingest.json) and the artifacts on disk: parse and route the
artifacts (orchestrator/ingest/assemble.py), judge what was measured with every post-run guard, and write the
run in one transaction whose run row already carries every flag -- the packet guards (G-ECN) fold over the
packet chunks while the writer streams them, before the run row is inserted. Nothing is written, read back and
updated; a re-ingest recomputes every guard from the same evidence and gives the same flags.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import Engine

from analysis.metrics.windows import analysis_window
from orchestrator.guards import ack, clock, cpu, ecn, pre_run, qdisc, ss
from orchestrator.guards.appwrite import bulk_release_findings, writer_findings
from orchestrator.guards.events import event_findings
from orchestrator.guards.probe import probe_flags
from orchestrator.ingest.assemble import assemble, clock_offsets, cpu_samples, measured_clock_offsets
from orchestrator.ingest.record import RunRecord
from orchestrator.ingest.startskew import StartTally
from orchestrator.plan import RunSpec
from orchestrator.storage.run_ingest import RunIngest
from orchestrator.storage.timing import RunTiming
from orchestrator.storage.writer import write_run
from schemas.flag import Flag, unique

log = logging.getLogger("tcplab.manager")


@dataclass
class RunOutcome:
    run_id: str
    status: str
    error: str | None = None
    flags: list[Flag] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    timing: RunTiming | None = None   # phase timings and overhead (engine/timing.py); None: not run here


def measurement_window(spec: RunSpec, t0_ns: int) -> tuple[int, int]:
    """The window the run's guards speak for: the metrics' window rule (analysis/metrics/windows.py) applied to
    the flows' scheduled spans, since the guards judge the run before its packets are read."""
    spans = [(t0_ns + int(f.start_s * 1e9), t0_ns + int((f.start_s + f.duration_s) * 1e9)) for f in spec.flows]
    w = analysis_window(spans, t0_ns, spec.analysis.warmup_s, spec.analysis.measure_s, spec.analysis.window)
    return w.start_ns, w.end_ns


def kernel_groups(evidence: list[dict]) -> dict[str, list[str]]:
    """The run's roles grouped by kernel, from the boot_id each host reported in its hello."""
    return cpu.kernel_groups({e["host"]: e["data"].get("capabilities", {}).get("boot_id") or ""
                              for e in evidence if e["phase"] == "hello"})


def cpu_guard(spec: RunSpec, record: RunRecord, run_dir: Path) -> tuple[list[dict], list[Flag]]:
    """M-CPU evidence and G-CPULOAD flags from the cpu_load artifacts. Unreadable samples are flagged (the
    host's load is unknown), never the reason to lose the run."""
    t0 = record.run.get("t0_ns")
    if t0 is None:
        return [], []
    window = measurement_window(spec, t0)
    groups = kernel_groups(record.evidence)
    evidence, flags = [], []
    for role, name, samples in cpu_samples(record, run_dir):
        host = "+".join(groups.get(role, [role]))
        if isinstance(samples, Exception):
            flags.append(Flag(guard="G-CPULOAD", host=host, message=f"{role}/{name} unreadable: {samples}"))
            continue
        summary = cpu.cpu_summary(samples.intervals(), window)
        evidence.append({"host": role, "phase": "cpu", "data": {"shared_by": groups.get(role, [role]),
                                                               "window_ns": list(window), "cpus": summary}})
        flags += cpu.cpuload_findings(summary, host)
    return evidence, flags


def evidence_guards(record: RunRecord) -> list[Flag]:
    """Guards on the host evidence the engine kept: clock offsets (G-CLOCK), what reset left (G-RESET)."""
    flags = clock.clock_findings(measured_clock_offsets(record))
    flags += [Flag(guard="G-RESET", host=e["host"], message=f"reset left {d}")
              for e in record.evidence if e["phase"] == "reset" for d in e["data"].get("differences", [])]
    # a host the engine could not reach at reset (agent dead or silent) may still hold the run's settings
    flags += [Flag(guard="G-RESET", host=e["host"], message=f"reset not done: {e['data']['error']}")
              for e in record.evidence if e["phase"] == "reset" and e["data"].get("error")]
    return flags


def measured_guards(spec: RunSpec, ingest: RunIngest) -> list[Flag]:
    """Guards on the parsed samples: qdisc counters (M-DROP, G-NETEM, G-HTB), ss (G-CC, G-SOCKBUF), the timed
    events' records (G-FAULT) and the app-limited writers' and bulk senders' logs (G-TASK)."""
    flags = [f for host, iface, arr in ingest.qdisc_samples for f in qdisc.qdisc_findings(spec, host, iface, arr)]
    ports = {r["flow_id"]: r.get("src_port") for r in ingest.flows}
    flags += [f for host, arr in ingest.ss_samples for check in (ss.ss_cc_findings, ss.ss_sockbuf_findings)
              for f in check(spec, host, arr, ports)]
    return (flags + event_findings(ingest.events) + writer_findings(spec.flows, ingest.app_writes)
            + bulk_release_findings(spec.flows, ingest.bulk_sends))


def ack_tally(spec: RunSpec, ingest: RunIngest, t0_ns: int | None) -> tuple[ack.AckTally, ...]:
    """The G-ACK fold when the run states an ACK policy (without captures it finds no point: flagged)."""
    if spec.ack_policy is None or t0_ns is None:
        return ()
    return (ack.AckTally(spec, ingest.flows, t0_ns, measurement_window(spec, t0_ns)),)


def finalise_run(db: Engine, run_dir: Path, record: RunRecord) -> RunOutcome:
    """Parse, judge and write one run; returns its outcome. A run whose artifacts a parser refuses is
    stored as failed with the reason (its artifacts stay on disk for `tcplab ingest` once fixed)."""
    spec = RunSpec.model_validate(record.run["spec"])
    run = dict(record.run)
    flags = [*pre_run.accepted(spec), *(Flag.from_stored(f) for f in run.get("flags", []))]
    cpu_evidence, cpu_flags = cpu_guard(spec, record, run_dir)
    flags += evidence_guards(record) + cpu_flags + probe_flags(spec)
    evidence = [*record.evidence, *cpu_evidence]
    ingest = None
    if record.complete:
        try:
            ingest = assemble(spec, record, run_dir)
        except ValueError as exc:   # ArtifactError, or a capture the pcap reader refuses
            run["error"] = f"ingest: {exc} (artifacts kept: `tcplab ingest {run_dir}` once fixed)"
            run["status"] = "failed"
            log.error("run not ingested run=%s error=%s", record.run_id, run["error"])
    observers: tuple = ()
    if ingest is not None:
        flags += measured_guards(spec, ingest)
        observers = (ecn.EcnTally(spec, ingest.flows),) if ecn.wants_ecn(spec) and ingest.packets else ()
        observers += ack_tally(spec, ingest, run.get("t0_ns"))
        observers += (StartTally(spec, ingest.flows, run.get("t0_ns"),
                                 {p: v["host"] for p, v in ingest.capture_points.items()}, clock_offsets(record)),)
    run["flags"] = [f.stored() for f in unique(flags)]
    if ingest is None:
        ingest = RunIngest(run=run, plan=record.plan, flows=record.flows, evidence=evidence)
    else:
        ingest = replace(ingest, run=run, evidence=evidence, packet_observers=observers)
    counts = write_run(db, ingest)   # the observers have seen every packet once this returns
    flags = unique([*flags, *(Flag.from_stored(f) for o in observers for f in o.flags())])
    return RunOutcome(record.run_id, run["status"], run.get("error"), flags, counts.as_dict())
