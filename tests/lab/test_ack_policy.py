"""G-ACK on the netns lab (host kernel): the receiver's ACK policy applied, read back, measured and reset.

One CUBIC flow server -> client through htb 20 Mbit/s (pfifo 30), offloads off, captured on the client
(client:to-aqm) and after the bottleneck (aqm:to-client). `per_segment` by `quickack_route` puts quickack on the
client's routes (read back from the kernel, gone after reset) and the capture shows about one data segment per
ACK; `delayed` by `stock` changes nothing and the capture shows the kernel's own delayed ACKs. The same stock
capture judged against a `per_segment` policy is flagged, naming the receiver, the flow and the ratio.
`tcp_delayed_acks_sysctl` (the host kernel lacks the sysctl) and `module_param` are refused, hosts untouched.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from sqlalchemy import text

from orchestrator.guards.ack import AckTally, expected_range
from orchestrator.guards.finalise import measurement_window
from orchestrator.ingest.assemble import assemble
from orchestrator.ingest.record import RunRecord
from orchestrator.plan import RunSpec
from schemas.routes import route_quickack
from tests.lab.conftest import TEST_PREFIX, one_flow_plan, run_lab_plan, run_plan_quietly, stored_flags

CAPTURES = "  captures:\n    - {host: client, toward: aqm}\n    - {host: aqm, toward: client}\n"


def _run(lab, tmp_path, mode: str, mechanism: str):
    _, state_dir = lab
    plan = tmp_path / f"ack-{mode}.yaml"
    plan.write_text(one_flow_plan(f"ack-{mode.replace('_', '-')}", f"ACK policy {mode} by {mechanism}",
                                  duration="6s", run_extra=f"  ack_policy: {{mode: {mode}, mechanism: {mechanism}}}\n"
                                  + CAPTURES))
    engine = run_lab_plan(plan, state_dir, tmp_path)
    [(run_id, flags)] = stored_flags(engine).items()
    with engine.connect() as conn:
        [ratio] = conn.execute(text("SELECT ack_ratio FROM flow")).scalars().all()
        evidence = {(r.host, r.phase): json.loads(r.data) if isinstance(r.data, str) else r.data
                    for r in conn.execute(text("SELECT host, phase, data FROM host_evidence"))}
    print(f"\n{mode}/{mechanism}: M-ACKRATIO {ratio}; flags {[str(f) for f in flags]}")
    return run_id, flags, ratio, evidence


def _client_routes() -> list[dict]:
    out = subprocess.run(["ip", "-n", f"{TEST_PREFIX}-client", "-j", "route", "show"], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def test_quickack_route_gives_an_ack_per_segment(lab, tmp_path):
    _, flags, ratio, evidence = _run(lab, tmp_path, "per_segment", "quickack_route")
    routes = [r for irb in evidence[("client", "apply")]["interfaces"].values()
              for r in irb["routes"]["inet"]]
    assert routes and all(route_quickack(r) for r in routes), routes      # read back from the kernel
    assert not [f for f in flags if f.guard in ("G-ACK", "G-RESET")], flags
    assert ratio is not None and 0.9 <= ratio < expected_range("per_segment", 1)[1], ratio
    assert _client_routes() and not any(route_quickack(r) for r in _client_routes())   # reset took it off


def test_stock_delayed_acks_are_measured_and_a_wrong_policy_is_flagged(lab, tmp_path):
    run_id, flags, ratio, evidence = _run(lab, tmp_path, "delayed", "stock")
    routes = [r for irb in evidence[("client", "apply")]["interfaces"].values()
              for r in irb["routes"]["inet"]]
    assert routes and not any(route_quickack(r) for r in routes)          # stock: nothing applied
    assert ratio is not None and ratio >= 1.5, ratio                       # fewer ACKs than segments
    lo, hi = expected_range("delayed", 1)
    assert bool([f for f in flags if f.guard == "G-ACK"]) == (not lo <= ratio <= hi), flags
    # the same packets judged against per_segment: flagged, naming receiver, flow and ratio
    run_dir = tmp_path / "results" / run_id
    record = RunRecord.load(run_dir)
    spec = RunSpec.model_validate(record.run["spec"])
    asked = spec.model_copy(update={"ack_policy": spec.ack_policy.model_copy(
        update={"mode": "per_segment", "mechanism": "quickack_route"})})
    ingest = assemble(asked, record, run_dir)
    tally = AckTally(asked, ingest.flows, record.run["t0_ns"], measurement_window(asked, record.run["t0_ns"]))
    for label, reader in ingest.packets:
        for chunk in reader:
            tally.observe(label, chunk)
    [flag] = tally.flags()
    print(flag)
    assert flag["guard"] == "G-ACK" and flag["host"] == "client"
    assert flag["message"].startswith("flow 0 (") and "at client:to-aqm" in flag["message"]
    assert f"{ratio:.2f} data segments per ACK" in flag["message"] and "per_segment/quickack_route" in flag["message"]


def test_mechanisms_this_host_cannot_apply_are_refused_before_any_host_is_touched(lab, tmp_path):
    if os.path.exists("/proc/sys/net/ipv4/tcp_delayed_acks"):
        pytest.skip(f"kernel {os.uname().release} has net.ipv4.tcp_delayed_acks: nothing to refuse here")
    _, state_dir = lab
    before = _client_routes()
    for mechanism, why in (
            ("tcp_delayed_acks_sysctl", f"host client (kernel {os.uname().release}) lacks sysctl "
                                        "net.ipv4.tcp_delayed_acks (patched kernels only)"),
            ("module_param", f"host client (kernel {os.uname().release}): ack_policy mechanism module_param is "
                             "not applied by this agent version")):
        plan = tmp_path / f"{mechanism}.yaml"
        plan.write_text(one_flow_plan(f"ack-{mechanism.replace('_', '-')}", "refused", run_extra=(
            f"  ack_policy: {{mode: per_segment, mechanism: {mechanism}}}\n")))
        rc, message = run_plan_quietly(plan, f"sqlite:///{tmp_path / f'{mechanism}.db'}", state_dir,
                                       tmp_path / "results")
        print(message)
        assert rc == 3 and "refused before touching any host" in message and why in message.replace("\n", " ")
    assert _client_routes() == before
