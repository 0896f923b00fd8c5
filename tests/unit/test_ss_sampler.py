"""The ss sampler end to end without a lab: plan field -> RunSpec -> scheduled task -> argv -> a real
`ss` poll loop on this host (no root needed) -> the parser."""
from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from agents.samplers import SsSample, ss_argv
from agents.tasks import make_runner
from orchestrator.engine.bind import schedule_tasks, timeline
from orchestrator.ingest.ss import parse_ss_with_stats
from orchestrator.inventory import Inventory
from orchestrator.plan import PlanError, expand, load_plan, load_plan_text
from orchestrator.plan.expansion.canon import canonical
from schemas import protocol

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"


def _with_ss(interval: str) -> str:
    return QUICKSTART.read_text().replace("  tcp_probe: true\n", f"  tcp_probe: true\n  ss: {{interval: {interval}}}\n")


def test_argv_is_a_list_with_the_filter_as_words() -> None:
    assert ss_argv([5201, 5202], ["10.0.3.2", "fd00::2"]) == [
        "ss", "-tinH", "(", "dport", "=", ":5201", "or", "dport", "=", ":5202", ")",
        "and", "(", "dst", "10.0.3.2", "or", "dst", "[fd00::2]", ")"]
    assert ss_argv([5201], []) == ["ss", "-tinH", "(", "dport", "=", ":5201", ")"]


def test_task_model_refuses_bad_values() -> None:
    ok = protocol.SsSampleTask(task_id="ss", start_ns=1, stop_ns=2, ports=[5201], dst_addrs=["10.0.0.1"])
    assert ok.interval_ms == 100 and ok.kind == "ss_sample"
    for bad in ({"ports": []}, {"interval_ms": 5}, {"dst_addrs": ["10.0.0.1 or sport = :22"]},
                {"dst_addrs": ["$(reboot)"]}):
        with pytest.raises(ValidationError):
            protocol.SsSampleTask(**{"task_id": "ss", "start_ns": 1, "stop_ns": 2, "ports": [5201], **bad})
    args = protocol.ScheduleArgs(run_id="r", tasks=[ok.model_dump()])
    assert isinstance(args.tasks[0], protocol.SsSampleTask)


def test_plan_field_reaches_the_runspec_and_leaves_other_run_ids_alone() -> None:
    plain = expand(load_plan(QUICKSTART))
    assert all(r.ss_interval_ms is None for r in plain)
    sampled = expand(load_plan_text(_with_ss("50ms"), "q.yaml"))
    assert [r.ss_interval_ms for r in sampled] == [50] * 8
    assert {r.run_id for r in sampled}.isdisjoint({r.run_id for r in plain})   # a different run
    # A field at its default is not part of the run hash: existing plans keep their run ids.
    from orchestrator.plan.model.template import RunTemplate
    assert "ss" in RunTemplate.HASH_SKIP_IF_DEFAULT
    doc = {"duration": "5s", "traffic": {"src": "a", "dst": "b", "cc": "reno", "flows": 1}}
    assert "ss" not in canonical(RunTemplate.model_validate(doc))
    assert "ss" in canonical(RunTemplate.model_validate({**doc, "ss": {"interval": "100ms"}}))


@pytest.mark.parametrize("interval", ["1500us", "5ms", "20s"])
def test_plan_refuses_bad_intervals(interval: str) -> None:
    with pytest.raises(PlanError, match="ss polling interval"):
        expand(load_plan_text(_with_ss(interval), "q.yaml"))


def _inventory() -> Inventory:
    def host(addr: str, toward: dict[str, str]) -> dict:
        return {"agent": "ws://127.0.0.1:1", "interfaces": {
            f"v{i}": {"toward": t, "addr": a, "plen": 24, "peer_addr": "10.0.0.254"}
            for i, (t, a) in enumerate(toward.items())}}
    return Inventory.model_validate({"kind": "netns", "token_file": "/dev/null", "hosts": {
        "client": host("10.0.1.2", {"aqm": "10.0.1.2"}), "server": host("10.0.3.2", {"aqm": "10.0.3.2"}),
        "aqm": host("10.0.1.1", {"client": "10.0.1.1", "server": "10.0.3.1"})}})


def test_scheduled_on_every_sender_with_its_ports_and_peers() -> None:
    spec = next(r for r in expand(load_plan_text(_with_ss("20ms"), "q.yaml")) if len(r.flows) == 2)
    tl = timeline(spec, 10**18)
    tasks = schedule_tasks(spec, _inventory(), tl)
    ss = [t for ts in tasks.values() for t in ts if isinstance(t, protocol.SsSampleTask)]
    assert len(ss) == 1 and ss[0] in tasks["server"]                 # data flows server -> client
    assert (ss[0].ports, ss[0].dst_addrs, ss[0].interval_ms) == ([5201, 5202], ["10.0.1.2"], 20)
    assert (ss[0].start_ns, ss[0].stop_ns) == (tl.start_ns, tl.stop_ns)
    plain = schedule_tasks(expand(load_plan(QUICKSTART))[0], _inventory(), tl)
    assert not any(isinstance(t, protocol.SsSampleTask) for ts in plain.values() for t in ts)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_real_poll_loop_is_bounded_by_stop_and_parses(tmp_path: Path) -> None:
    start = time.time_ns()
    spec = protocol.SsSampleTask(task_id="ss", start_ns=start, stop_ns=start + 400_000_000, interval_ms=50,
                                 ports=[1], dst_addrs=["127.0.0.1"])
    runner = make_runner(spec, tmp_path)
    assert isinstance(runner, SsSample)
    asyncio.run(runner.run())
    took = time.time_ns() - start
    assert runner.state == "done", runner.detail
    assert took < 1_500_000_000
    arts = runner.artifacts()
    assert [(p.name, k) for p, k in arts] == [("ss.txt", "ss")]
    text = arts[0][0].read_text()
    assert text.startswith("# ss -tinH ( dport = :1 ) and ( dst 127.0.0.1 )\n")
    rows, stats = parse_ss_with_stats(text)
    # >= 2 polls, not 8: on a loaded machine each `ss` spawn can take most of a slot; overruns are counted as missed
    assert rows.size == 0 and stats.polls == runner.meta["polls"] >= 2 and stats.empty_polls == stats.polls
    assert runner.meta["polls"] + runner.meta["missed"] <= 9


def test_an_overrun_past_the_end_counts_only_slots_before_it() -> None:
    from agents.taskbase import skipped_before

    assert skipped_before(100, 3, 50, 1_000) == 3          # all three slots were due
    assert skipped_before(900, 5, 50, 1_000) == 2          # 900 and 950; 1000.. were never due
    assert skipped_before(1_000, 2, 50, 1_000) == 0


def test_a_poller_behind_its_beat_skips_slots_and_still_stops_on_time() -> None:
    from agents.taskbase import missed_remark, next_beat

    # on time: the next slot, nothing missed
    assert next_beat(1_000, 1_200, 1_000, 10_000) == (2_000, 0)
    # a poll that took 3.5 slots: the slots it overran are skipped and counted
    assert next_beat(1_000, 4_500, 1_000, 10_000) == (5_000, 3)
    # a 1 ms beat whose every poll takes 5 ms polls every 6th slot (the first free one after it) and ends
    # with the sampling, not five times too late
    slot, polls, missed, now = 0, 0, 0, 0
    while slot < 1_000_000_000:
        polls, now = polls + 1, max(now, slot) + 5_000_000
        slot, overran = next_beat(slot, now, 1_000_000, 1_000_000_000)
        missed += overran
    assert now <= 1_005_000_000 and polls == 167 and polls + missed == 1_000
    assert "polled 167 of 1000 slots of 1 ms" in missed_remark(polls, missed, 1)
    assert missed_remark(99, 1, 1) == ""          # within 5 %: no remark
