"""M-CPU and the G-CPULOAD guard: the agent's /proc/stat sampler, the parser, the guard and the runner glue.

Fixtures are literal sampler output from this 2-core machine: `quiet.txt` (nothing running) and
`cpu1_spinning.txt` (a shell loop pinned to CPU 1 with taskset for 1.2 s of the 1.5 s sampled).
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from agents.samplers import CpuLoad
from agents.tasks import make_runner
from orchestrator.engine.bind import schedule_tasks, timeline
from orchestrator.guards import cpu as guards
from orchestrator.guards.cpu import kernel_groups
from orchestrator.guards.finalise import cpu_guard, measurement_window
from orchestrator.ingest.cpu import parse_cpu
from orchestrator.ingest.record import RunRecord
from orchestrator.plan import expand, load_plan
from schemas import protocol
from tests.unit.test_ss_sampler import QUICKSTART, _inventory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cpu"
QUIET = (FIXTURES / "quiet.txt").read_text()
SPINNING = (FIXTURES / "cpu1_spinning.txt").read_text()


def _whole(text: str) -> tuple[int, int]:
    ts = parse_cpu(text).ts_ns
    return int(ts[0]), int(ts[-1])


def test_parser_reads_every_sample_and_cpu() -> None:
    s = parse_cpu(SPINNING)
    assert s.cpus == ("cpu0", "cpu1")
    assert s.ticks.shape == (16, 2, 8)
    assert s.ticks[0, 1].tolist() == [5938, 29, 1960, 15307, 450, 0, 66, 11]   # the fixture's first cpu1 line
    assert np.all(np.diff(s.ticks, axis=0) >= 0)                                # cumulative counters


def test_a_spinning_core_is_busy_and_the_other_is_not() -> None:
    iv = parse_cpu(SPINNING).intervals()
    assert iv.busy.shape == (15, 2)
    spin = iv.busy[:, 1]
    # the loop ran for 1.2 s of 1.5 s: at least 10 of the 15 intervals are all busy ticks on CPU 1
    assert np.sum(spin >= 0.99) >= 10, spin
    assert np.nanmean(iv.busy[:, 0]) < 0.5
    assert np.all((iv.busy >= 0) & (iv.busy <= 1))


def test_guard_flags_the_spinning_core_only() -> None:
    summary = guards.cpu_summary(parse_cpu(SPINNING).intervals(), _whole(SPINNING))
    assert summary["cpu1"]["saturated_share"] > 0.6
    assert summary["cpu0"]["saturated_share"] <= guards.CPULOAD_WINDOW_SHARE
    found = guards.cpuload_findings(summary, "aqm+client+server")
    assert [f.guard for f in found] == ["G-CPULOAD"]
    assert found[0].host == "aqm+client+server" and found[0].message.startswith("cpu1 was > 90% busy")


def test_guard_is_silent_on_a_quiet_host() -> None:
    summary = guards.cpu_summary(parse_cpu(QUIET).intervals(), _whole(QUIET))
    assert set(summary) == {"cpu0", "cpu1"}
    assert all(s["busy_mean"] < 0.5 for s in summary.values()), summary
    assert guards.cpuload_findings(summary, "aqm") == []


def test_only_the_window_counts() -> None:
    iv = parse_cpu(SPINNING).intervals()
    # the last 0.2 s, after the loop had ended: CPU 1 idle again
    lo, hi = _whole(SPINNING)
    assert guards.cpu_summary(iv, (hi - 200_000_000, hi))["cpu1"]["saturated_share"] == 0.0
    outside = guards.cpu_summary(iv, (hi + 10**9, hi + 2 * 10**9))
    assert outside == {}
    [f] = guards.cpuload_findings(outside, "server")
    assert "no CPU sample covers the analysis window" in f.message


@pytest.mark.parametrize("text, where", [
    ("cpu0 1 2 3 4 5 6 7 8\n", "line 1: 'cpu0 1 2 3 4 5 6 7 8' before the first"),
    ("@ 1\ncpu0 1 2 3\n", "line 2: 'cpu0 1 2 3' is not a per-CPU /proc/stat line"),
    ("@ 1\ncpu 1 2 3 4 5 6 7 8\n", "line 2: 'cpu 1 2 3 4 5 6 7 8' is not a per-CPU"),
    ("@ x\n", "line 1: '@ x' is not '@ <ns>'"),
    ("@ 1\ncpu0 1 2 3 4 5 6 7 x\n", "line 2: .* not an integer"),
    ("@ 1\ncpu0 1 2 3 4 5 6 7 8\ncpu1 1 2 3 4 5 6 7 8\n@ 2\ncpu0 1 2 3 4 5 6 7 8\n", "line 5: .*hotplug"),
    ("@ 2\ncpu0 1 2 3 4 5 6 7 8\n@ 1\ncpu0 1 2 3 4 5 6 7 8\n", "not increasing"),
])
def test_parser_names_the_line_and_why(text: str, where: str) -> None:
    with pytest.raises(ValueError, match=where):
        parse_cpu(text)


def test_one_sampler_per_kernel() -> None:
    assert kernel_groups({"client": "b1", "aqm": "b1", "server": "b1"}) == {"client": ["client", "aqm", "server"]}
    assert kernel_groups({"client": "b1", "aqm": "g2", "server": "b1"}) == {"client": ["client", "server"],
                                                                            "aqm": ["aqm"]}
    assert kernel_groups({"client": "", "aqm": ""}) == {"client": ["client"], "aqm": ["aqm"]}
    spec = expand(load_plan(QUICKSTART))[0]
    tl = timeline(spec, 10**18)
    netns = schedule_tasks(spec, _inventory(), tl, {"client": "b", "aqm": "b", "server": "b"})
    cpu = [(r, t) for r, ts in netns.items() for t in ts if isinstance(t, protocol.CpuLoadTask)]
    assert [r for r, _ in cpu] == ["client"]
    assert (cpu[0][1].start_ns, cpu[0][1].stop_ns) == (tl.start_ns, tl.stop_ns)
    vm = schedule_tasks(spec, _inventory(), tl, {"client": "b", "aqm": "guest", "server": "b"})
    assert sorted(r for r, ts in vm.items() for t in ts if isinstance(t, protocol.CpuLoadTask)) == ["aqm", "client"]


def test_window_starts_after_the_warmup() -> None:
    spec = expand(load_plan(QUICKSTART))[0]
    tl = timeline(spec, 10**18)
    lo, hi = measurement_window(spec, tl.t0_ns)
    assert lo == tl.t0_ns + int(spec.analysis.warmup_s * 1e9)
    assert tl.start_ns < lo < hi < tl.stop_ns


def _hello(role: str, boot_id: str) -> dict:
    return {"host": role, "phase": "hello", "data": {"capabilities": {"boot_id": boot_id}}}


def test_cpu_guard_turns_artifacts_into_evidence_and_flags(tmp_path: Path) -> None:
    spec = expand(load_plan(QUICKSTART))[0]
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "cpu.txt").write_text(SPINNING)
    (tmp_path / "aqm").mkdir()
    (tmp_path / "aqm" / "cpu.txt").write_text(SPINNING.replace("cpu1 ", "cpuX ", 1))
    artifacts = {"client": [{"name": "cpu.txt", "kind": "cpu"}], "aqm": [{"name": "cpu.txt", "kind": "cpu"},
                                                                         {"name": "x.pcap", "kind": "pcap"}]}
    lo, _ = measurement_window(spec, 0)
    t0 = _whole(SPINNING)[0] - lo    # the run's window starts with the samples
    record = RunRecord(run={"run_id": spec.run_id, "status": "complete", "t0_ns": t0}, plan=None, flows=[],
                       evidence=[_hello("client", "b1"), _hello("server", "b1"), _hello("aqm", "g2")],
                       artifacts=artifacts)
    evidence, flags = cpu_guard(spec, record, tmp_path)
    assert [e["host"] for e in evidence] == ["client"]
    assert evidence[0]["phase"] == "cpu" and evidence[0]["data"]["shared_by"] == ["client", "server"]
    assert [(f.guard, f.host) for f in flags] == [("G-CPULOAD", "client+server"), ("G-CPULOAD", "aqm")]
    assert str(flags[0]).startswith("G-CPULOAD host client+server: cpu1 was > 90% busy")
    assert str(flags[1]).startswith("G-CPULOAD host aqm: aqm/cpu.txt unreadable: line 4: 'cpuX")


def test_real_sampler_is_bounded_and_parses(tmp_path: Path) -> None:
    start = time.time_ns()
    spec = protocol.CpuLoadTask(task_id="cpu-load", start_ns=start, stop_ns=start + 300_000_000, interval_ms=50)
    runner = make_runner(spec, tmp_path)
    assert isinstance(runner, CpuLoad)
    asyncio.run(runner.run())
    assert runner.state == "done", runner.detail
    assert time.time_ns() - start < 1_000_000_000
    samples = parse_cpu((tmp_path / "cpu.txt").read_text())
    assert len(samples.cpus) == len(Path("/proc/stat").read_text().split("\ncpu")) - 1
    assert runner.meta["samples"] == len(samples.ts_ns) >= 6
    assert runner.artifacts() == [(tmp_path / "cpu.txt", "cpu")]
