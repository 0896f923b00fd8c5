"""Per-run preflight (engine/preflight.py), the capability cache (engine/capcache.py), the dry-run table and
the summary and exit code of `tcplab run` (engine/plan_run.py): pure, no agent."""
from __future__ import annotations

import datetime as dt
import io

from rich.console import Console

from orchestrator.engine import capcache
from orchestrator.engine.dry_run import cell_label, count_line, verdict_table
from orchestrator.engine.plan_run import exit_code, summary_line
from orchestrator.engine.preflight import REFUSED, Refused, Runnable, check_run, check_runs, refused_row
from orchestrator.engine.runner import PENDING, RunOutcome
from orchestrator.inventory import Inventory
from orchestrator.plan import expand, load_plan_text
from orchestrator.storage.run_ingest import RunIngest, validate
from schemas.protocol import Capabilities, HelloResult

PLAN = """name: mixed
roles: [client, aqm, server]
run:
  duration: 2s
  bottleneck: {at: {host: aqm, toward: client}, rate: 20mbit, queue: {kind: pfifo, limit: 100}}
  traffic: {src: server, dst: client, cc: reno, flows: 1}
  hosts:
    all:
      offloads: {tso: off, gso: off, gro: off}
experiments:
  - name: fifo
  - name: codel
    set: {bottleneck.queue: {kind: fq_codel}}
  - name: dctcp
    set: {traffic.cc: dctcp}
"""
NOW = dt.datetime(2026, 11, 23, 20, 0, tzinfo=dt.UTC)


def caps(release: str = "6.18.1") -> Capabilities:
    return Capabilities(kernel_release=release, qdiscs=["pfifo", "htb"], congestion_controls=["reno", "cubic"],
                        allowed_congestion_controls=["reno"], offload_features={}, tools={},
                        tracepoints=["tcp:tcp_probe"])


def inventory(roles=("client", "aqm", "server")) -> Inventory:
    return Inventory.model_validate({"kind": "vm", "token_file": "/dev/null", "hosts": {
        r: {"agent": f"unix:/run/{r}.sock", "interfaces": {}} for r in roles}})


def specs():
    return {s.experiment: s for s in expand(load_plan_text(PLAN, "mixed.yaml"))}


def test_each_run_is_judged_on_its_own():
    runs = specs()
    every = {r: caps() for r in ("client", "aqm", "server")}
    verdicts = check_runs(list(runs.values()), every, inventory())
    assert [type(v) for v in verdicts] == [Runnable, Refused, Refused]
    assert verdicts[1].reasons == ("host aqm (kernel 6.18.1) lacks qdisc fq_codel",)
    assert verdicts[2].reasons == ("host server (kernel 6.18.1) lacks congestion control dctcp "
                                   "(available: reno cubic)",)
    assert verdicts[1].error == "refused before touching any host: host aqm (kernel 6.18.1) lacks qdisc fq_codel"


def test_a_role_the_inventory_lacks_is_named_once():
    v = check_run(specs()["fifo"], {r: caps() for r in ("client", "aqm")}, inventory(("client", "aqm")))
    assert isinstance(v, Refused) and v.reasons == ("host server: not in the inventory",)


def test_a_pitfall_guard_the_plan_did_not_accept_refuses_the_run():
    spec = specs()["fifo"]
    on = spec.model_copy(update={"hosts": {**spec.hosts, "aqm": spec.hosts["aqm"].model_copy(
        update={"offloads": {}})}})
    v = check_run(on, {r: caps() for r in ("client", "aqm", "server")}, inventory())
    assert isinstance(v, Refused) and [r.split(" ")[:2] for r in v.reasons] == [["guard", "G-OFFLOAD"]]


def test_a_refused_row_is_a_valid_run_row_with_its_reasons():
    v = check_run(specs()["codel"], {r: caps() for r in ("client", "aqm", "server")}, inventory())
    plan_row = {"plan_sha256": "0" * 64, "name": "mixed", "path": "mixed.yaml", "text": PLAN, "created_at": NOW}
    row = refused_row(v, plan_row, ["lab"], NOW)
    assert (row["status"], row["t0_ns"], row["tags"]) == (REFUSED, None, ["lab"])
    assert row["error"] == "refused before touching any host: host aqm (kernel 6.18.1) lacks qdisc fq_codel"
    validate(RunIngest(run=row, plan=plan_row))     # the writer takes it


def hello(release: str = "6.18.1") -> HelloResult:
    return HelloResult(proof="0" * 64, agent_version="1", protocol=1, hostname="h", interfaces=[],
                       capabilities=caps(release))


def test_the_cache_is_fresh_for_a_recent_hello_at_the_same_agent(tmp_path):
    inv = inventory()
    for role, host in inv.hosts.items():
        capcache.record(tmp_path, role, host.agent, hello(), NOW - dt.timedelta(minutes=5))
    entries = capcache.load(tmp_path)
    assert entries["aqm"].capabilities == caps()
    assert capcache.stale_hosts(entries, inv, NOW) == []
    later = NOW + dt.timedelta(seconds=capcache.MAX_AGE_S)
    assert capcache.stale_hosts(entries, inv, later) == [
        f"{r}: last hello 3900 s ago (fresh for 3600 s)" for r in ("client", "aqm", "server")]


def test_the_cache_is_stale_for_another_agent_url_or_a_host_never_seen(tmp_path):
    capcache.record(tmp_path, "client", "unix:/elsewhere.sock", hello(), NOW)
    capcache.record(tmp_path, "aqm", "unix:/run/aqm.sock", hello(), NOW)
    assert capcache.stale_hosts(capcache.load(tmp_path), inventory(), NOW) == [
        "client: last seen at unix:/elsewhere.sock, the inventory says unix:/run/client.sock",
        "server: never seen"]


def test_a_cache_that_does_not_read_back_is_empty_not_an_error(tmp_path):
    assert capcache.parse("not json") == {}
    assert capcache.parse('{"aqm": {"agent": "x"}}') == {}
    assert capcache.load(tmp_path / "missing") == {}


def test_the_dry_run_table_shows_every_run_and_its_verdict():
    verdicts = check_runs(list(specs().values()), {r: caps() for r in ("client", "aqm", "server")}, inventory())
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(verdict_table(verdicts, "from the cache"))
    text = out.getvalue()
    assert "mixed-fifo-" in text and "runnable" in text and "refused: host aqm (kernel 6.18.1) lacks qdisc" in text
    assert count_line(verdicts) == "3 runs: 1 runnable, 2 refused"
    assert [cell_label(v.spec) for v in verdicts] == [
        "queue=pfifo(limit=100) cc=reno", "queue=fq_codel() cc=reno", "queue=pfifo(limit=100) cc=dctcp"]


def outcome(status: str) -> RunOutcome:
    return RunOutcome("r", status)


def test_exit_code_and_summary():
    assert exit_code([outcome("complete")]) == 0
    assert exit_code([]) == 0
    assert exit_code([outcome("complete"), outcome(REFUSED)]) == 3
    assert exit_code([outcome("failed"), outcome(REFUSED)]) == 1
    assert exit_code([outcome(PENDING)]) == 1
    assert summary_line([outcome("complete"), outcome(REFUSED), outcome("failed")], 2) == \
        "3 runs: 1 complete, 1 failed, 1 refused (2 already complete, skipped)"
    assert summary_line([outcome(PENDING)], 0) == "1 runs: 0 complete, 0 failed, 0 refused, 1 not stored"
