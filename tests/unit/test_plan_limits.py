"""Issue 13, item 8: the plan loader is bounded on any input and refuses what the agents would refuse.

Each reported case is replayed with a time bound; the costly ones run in a child process with a timeout, so
a regression (a hang, a MemoryError) fails this test instead of stalling the suite, and the child reports
its wall time and peak memory, which the test prints.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.engine.bind import schedule_tasks, timeline
from orchestrator.inventory import HostEntry, InterfaceEntry, Inventory
from orchestrator.plan import PlanError, expand, load_plan, load_plan_text
from orchestrator.plan.commands import cmd_validate
from orchestrator.plan.expansion.matrix import count_runs
from orchestrator.plan.model import bounds
from orchestrator.plan.model.plan import Plan
from schemas import limits, protocol
from tests.support.shipped import STUDY_PLANS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = (ROOT / "experiments" / "quickstart.yaml").read_text()
RED_NETEM = (ROOT / "tests" / "plans" / "good_red_netem.yaml").read_text()
LINE = re.compile(r"^[^\n]+:\d+:\d+: \S.*: .+$")

_CHILD = """
import json, sys, time
from orchestrator.plan import PlanError, load_plan, load_plan_text
arg, is_path = sys.argv[1], sys.argv[2] == "path"
t0 = time.monotonic()
try:
    load_plan(arg) if is_path else load_plan_text(open(arg, encoding="utf-8").read(), "plan.yaml")
    out = {"outcome": "ok", "issues": []}
except PlanError as exc:
    out = {"outcome": "PlanError", "issues": [str(i) for i in exc.issues[:5]],
           "located": all(i.file and i.line >= 1 and i.col >= 1 for i in exc.issues)}
out["seconds"] = time.monotonic() - t0
# peak RSS of this process image (VmHWM; ru_maxrss would include the forking pytest's pages)
out["maxrss_mb"] = int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")).split()[1]) / 1024
print(json.dumps(out))
"""


def in_child(arg: str | Path, *, is_path: bool = False, timeout: float = 30) -> dict:
    """Load a plan (a file to read as text, or a path for load_plan) in a child; its time and peak memory."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(arg), "path" if is_path else "text"],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def issues_of(text: str) -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan_text(text, "plan.yaml")
    assert all(i.line >= 1 and i.col >= 1 for i in info.value.issues)
    return [str(i) for i in info.value.issues]


def timed_issues(text: str, bound_s: float = 2.0) -> list[str]:
    t0 = time.monotonic()
    issues = issues_of(text)
    took = time.monotonic() - t0
    print(f"{took * 1000:.0f} ms: {issues[0][:150]}")
    assert took < bound_s
    return issues


# ------------------------------------------------------------------ numbers

@pytest.mark.parametrize("written", ["1e-999999999", '"1e-999999999"', '"1e999999999"', "'1e-99999999999999'"])
def test_huge_exponents_are_refused_at_once(tmp_path: Path, written: str) -> None:
    text = RED_NETEM.replace("adaptive: true}", f"adaptive: true, probability: {written}}}")
    (tmp_path / "p.yaml").write_text(text)
    got = in_child(tmp_path / "p.yaml", timeout=20)   # was > 60 s of CPU (a billion-digit Fraction)
    print(written, got)
    assert got["outcome"] == "PlanError" and got["located"] and got["seconds"] < 2
    assert "run.bottleneck.queue.probability" in got["issues"][0]


def test_netem_loss_with_a_huge_exponent() -> None:
    text = RED_NETEM.replace("{kind: netem, delay: 1ms, limit: 1000}",
                             '{kind: netem, delay: 1ms, limit: 1000, loss: "1e999999999"}')
    (issue,) = timed_issues(text)
    assert issue.startswith("plan.yaml:18:63: run.hosts.aqm.qdiscs.server[0].loss: ")


@pytest.mark.parametrize("written", [".inf", "-.inf", ".nan", ".NaN", "1e400"])
def test_non_finite_probabilities_are_located_errors(written: str) -> None:
    text = RED_NETEM.replace("adaptive: true}", f"adaptive: true, probability: {written}}}")
    (issue,) = timed_issues(text)
    assert issue.startswith("plan.yaml:11:") and "probability" in issue and "finite" in issue


def test_integers_beyond_python_int_limit_are_located_errors() -> None:
    digits = "9" * 5000        # int() refuses over 4,300 digits (ValueError, was a crash)
    (issue,) = timed_issues(QUICKSTART.replace("repetitions: 1", f"repetitions: {digits}"))
    assert issue.startswith("plan.yaml:10:14: repetitions:") and f"at most {bounds.MAX_NUMBER_CHARS}" in issue
    (issue,) = timed_issues(QUICKSTART.replace("traffic.flows: [1, 2]", f"traffic.flows: [1, '{digits}']"))
    assert issue.startswith("plan.yaml:51:24: matrix.axes['traffic.flows'][1]: ") and "integer" in issue


# ------------------------------------------------------------------ files

def test_non_regular_files_are_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", fifo, tmp_path):   # /dev/zero was a MemoryError, a FIFO blocked for ever
        got = in_child(path, is_path=True, timeout=20)
        print(path, got)
        assert got["outcome"] == "PlanError" and got["seconds"] < 1
        assert got["issues"] == [f"{path}:1:1: (plan): the plan is not a regular file"]


def test_a_file_over_the_size_bound_is_refused_unparsed(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: x\nl: [" + "1, " * (4 * 2**20 // 3) + "1]\n")   # the reported 4 MB list
    got = in_child(big, is_path=True)
    print(got)
    assert got["outcome"] == "PlanError" and got["seconds"] < 1 and got["maxrss_mb"] < 150
    assert f"larger than {bounds.MAX_PLAN_BYTES} bytes" in got["issues"][0]


# ------------------------------------------------------------------ YAML size and shape

@pytest.mark.parametrize("shape", ["flow list", "block list", "mapping"])
def test_node_bound_applies_while_parsing(tmp_path: Path, shape: str) -> None:
    n = bounds.MAX_PLAN_BYTES // 8
    body = {"flow list": "l: [" + "1, " * n + "1]\n",
            "block list": "l:\n" + "- 1\n" * n,
            "mapping": "m:\n" + "".join(f"  k{i}: 1\n" for i in range(n // 2))}[shape]
    plan = tmp_path / "p.yaml"
    plan.write_text("name: x\n" + body[: bounds.MAX_PLAN_BYTES - 20].rsplit("\n", 1)[0] + "\n")
    got = in_child(plan)   # was 96 s and 1.4 GB for 4 MB: every node built before the bound applied
    print(shape, got)
    assert got["outcome"] == "PlanError" and got["seconds"] < 4 and got["maxrss_mb"] < 150
    assert f"more than {bounds.MAX_NODES} YAML nodes" in got["issues"][0]


def test_deep_nesting_and_alias_bombs_are_refused(tmp_path: Path) -> None:
    (issue,) = timed_issues("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert f"nested more than {bounds.MAX_DEPTH} levels deep" in issue
    (issue,) = timed_issues("a: " + "{a: " * 1000 + "1" + "}" * 1000 + "\n")
    assert "nested" in issue
    bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    (issue,) = timed_issues(bomb)
    assert "too large" in issue
    (issue,) = timed_issues("a: &x [*x]\n")
    assert "recursive" in issue


# ------------------------------------------------------------------ matrix size

def _axis_plan(n_flows: int, n_rates: int) -> str:
    """The reported 5 KB plan: traffic.flows 1..n on one axis, n_rates rates on another."""
    return (QUICKSTART
            .replace("traffic.flows: [1, 2]", f"traffic.flows: [{', '.join(str(i) for i in range(1, n_flows + 1))}]")
            .replace("bottleneck.rate: [20mbit, 50mbit]",
                     f"bottleneck.rate: [{', '.join(f'{i + 1}mbit' for i in range(n_rates))}]")
            .replace("traffic.cc: [reno, cubic]", "traffic.cc: [reno, cubic]"))


def test_run_count_is_computed_before_any_cell(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(_axis_plan(1024, 9))   # 2 x 9 x 1024 = 18,432 cells: was 487 s and 13.7 GB
    got = in_child(plan)
    print(f"{plan.stat().st_size} B plan:", got)
    assert got["outcome"] == "PlanError" and got["seconds"] < 2 and got["maxrss_mb"] < 150
    assert f"up to 18432 runs, more than {bounds.MAX_RUNS}" in got["issues"][0]


def test_flows_over_all_cells_are_bounded(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(_axis_plan(1024, 4))   # 8,192 runs (under MAX_RUNS) of up to 1,024 flows each
    got = in_child(plan)
    print(got)
    assert got["outcome"] == "PlanError" and got["seconds"] < 8 and got["maxrss_mb"] < 150
    assert f"more than {bounds.MAX_PLAN_FLOWS} flows in all" in got["issues"][0]


def test_flows_of_one_run_are_bounded() -> None:
    text = QUICKSTART.replace("tcp_probe: true", "tcp_probe: false\n  background: [{src: server, dst: client, "
                              "cc: reno, flows: 1024, base_port: 10000}]")
    issues = timed_issues(text)
    assert any(f"1026 flows, more than {bounds.MAX_FLOWS_PER_RUN}" in i for i in issues)


# ------------------------------------------------------------------ the agents' limits

def test_duration_beyond_the_agent_limit_names_the_field() -> None:
    (issue,) = timed_issues(QUICKSTART.replace("duration: 5s", "duration: 2h"))
    assert issue.startswith("plan.yaml:14:13: run.duration: ") and f"{limits.MAX_RUN_SECONDS} s" in issue


def test_duration_on_an_axis_is_located_at_the_axis_value() -> None:
    (issue,) = timed_issues(QUICKSTART.replace("traffic.flows: [1, 2]", "duration: [5s, 2h]"))
    assert issue.startswith("plan.yaml:51:") and "matrix.axes.duration[1]" in issue


def test_sampling_intervals_follow_the_agent_bounds() -> None:
    (issue,) = timed_issues(QUICKSTART.replace("interval: 10ms", "interval: 100s"))
    assert "run.qdisc_stats.interval" in issue and f"{limits.MAX_SAMPLE_INTERVAL_MS}ms" in issue
    (issue,) = timed_issues(QUICKSTART.replace("tcp_probe: true", "tcp_probe: true\n  ss: {interval: 5ms}"))
    assert "run.ss.interval" in issue and f"{limits.MIN_POLL_INTERVAL_MS}ms" in issue


def test_udp_rate_tasks_and_ports_follow_the_agent_bounds() -> None:
    (issue,) = timed_issues(QUICKSTART.replace("tool: iperf3", "tool: udp\n    rate: 9tbit"))
    assert "run.traffic.rate" in issue and "400gbit" in issue
    many = limits.MAX_PORTS_PER_SAMPLER + 1
    issues = timed_issues(QUICKSTART.replace("traffic.flows: [1, 2]", f"traffic.flows: [1, {many}]"))
    assert any("matrix.axes['traffic.flows'][1]" in i and f"more than {limits.MAX_PORTS_PER_SAMPLER}" in i
               for i in issues)
    tasks = limits.MAX_TASKS_PER_SCHEDULE + 1
    issues = timed_issues(QUICKSTART.replace("traffic.flows: [1, 2]", f"traffic.flows: [1, {tasks}]")
                          .replace("tcp_probe: true", "tcp_probe: false"))
    assert any(f"more than {limits.MAX_TASKS_PER_SCHEDULE}" in i for i in issues)


def test_bulk_flows_of_one_instant_are_one_task_on_their_sender_and_a_sink_each_on_the_receiver() -> None:
    tasks = limits.MAX_TASKS_PER_SCHEDULE + 1
    issues = timed_issues(QUICKSTART.replace("traffic.flows: [1, 2]", f"traffic.flows: [1, {tasks}]")
                          .replace("tcp_probe: true", "tcp_probe: false").replace("tool: iperf3", "tool: bulk"))
    counted = [i for i in issues if f"more than {limits.MAX_TASKS_PER_SCHEDULE}" in i]
    assert counted and all("'client' would run" in i for i in counted), counted   # the sinks, not the sender


# ------------------------------------------------------------------ YAML 1.1 forms

def test_yaml_1_1_forms_read_as_written() -> None:
    (issue,) = timed_issues(QUICKSTART.replace("duration: 5s", "duration: 1:30:00"))   # 1.1: 5400
    assert issue.startswith("plan.yaml:14:13: run.duration: ") and "'1:30:00'" in issue and "90min" in issue
    (issue,) = timed_issues(QUICKSTART.replace("repetitions: 1", "repetitions: 010"))   # 1.1: 8
    assert "repetitions" in issue and "leading zero" in issue
    plan = load_plan_text(QUICKSTART.replace("name: quickstart", "name: no").replace("tso: off", "tso: no"))
    assert plan.name == "no"   # 1.1: the boolean False, refused as a name
    assert plan.run.hosts["all"].offloads["tso"] is False   # a bool field still reads no/off as False


def test_every_shipped_plan_reads_as_under_yaml_1_1_and_fits_the_bounds() -> None:
    """The switch to the core schema changes no existing plan (the same typed plan, field for field, so the
    same runs: `expand` is a function of the plan), and every study plan is far inside the bounds."""
    for path in [*STUDY_PLANS, *sorted((ROOT / "tests" / "plans").glob("good_*"))]:
        plan = load_plan(path)
        assert plan == Plan.model_validate(yaml.safe_load(path.read_text())), path
        assert count_runs(plan) <= bounds.MAX_RUNS and path.stat().st_size < bounds.MAX_PLAN_BYTES


# ------------------------------------------------------------------ the CLI

@pytest.mark.parametrize("text", ["a: \x00", "a: \"\\ud800\": 1\n", "name: x\n\"\\ud800\\n\": 1\n", "- [", "{",
                                  "name: 010\n", "run: !!python/object:os.system x\n", "!!binary aGk=\n"])
def test_validate_prints_located_lines_only(tmp_path: Path, text: str) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(text, encoding="utf-8", errors="surrogatepass")
    out, err = io.StringIO(), io.StringIO()
    assert cmd_validate(plan, out, err) == 2
    lines = err.getvalue().splitlines()
    print(lines)
    assert lines[-1].endswith(("1 problem", "problems")) and all(LINE.match(x) for x in lines[:-1])
    assert all(x.isprintable() for x in lines)


# ------------------------------------------------------------------ one boundary for the loader and the agent

def _mesh(roles: list[str]) -> Inventory:
    """A testbed where every role has an interface toward every other role."""
    return Inventory(kind="physical", token_file="/dev/null", hosts={
        r: HostEntry(agent=f"unix:///run/{r}.sock", interfaces={
            f"to-{o}": InterfaceEntry(toward=o, addr=f"10.{i}.{j}.1", plen=24, peer_addr=f"10.{i}.{j}.2")
            for j, o in enumerate(roles) if o != r})
        for i, r in enumerate(roles)})


def _schedule(text: str) -> None:
    """Expand the plan unchecked and build what the engine sends each agent (raises the protocol's
    ValidationError when an agent would refuse it); one kernel per host, so every host gets a CPU sampler."""
    plan = Plan.model_validate(yaml.safe_load(text))
    for spec in expand(plan):
        for tasks in schedule_tasks(spec, _mesh(plan.roles), timeline(spec, 10**18),
                                    {r: r for r in plan.roles}).values():
            protocol.ScheduleArgs(run_id=spec.run_id, tasks=tasks)


ONE_RUN = QUICKSTART.split("\nmatrix:")[0] + "\n"
AT_THE_LIMIT = {   # field: (the plan at an agent limit, the plan one step over it)
    "duration": (f"duration: {limits.MAX_RUN_SECONDS}s", f"duration: {limits.MAX_RUN_SECONDS + 1}s"),
    "qdisc_stats": (f"interval: {limits.MAX_SAMPLE_INTERVAL_MS}ms",
                    f"interval: {limits.MAX_SAMPLE_INTERVAL_MS + 1}ms"),
    "ss": (f"ss: {{interval: {limits.MIN_POLL_INTERVAL_MS}ms}}",
           f"ss: {{interval: {limits.MIN_POLL_INTERVAL_MS - 1}ms}}"),
    "udp": (f"rate: {limits.MAX_UDP_RATE_BIT}bit", f"rate: {limits.MAX_UDP_RATE_BIT + 1}bit"),
    "ports": (f"flows: {limits.MAX_PORTS_PER_SAMPLER}", f"flows: {limits.MAX_PORTS_PER_SAMPLER + 1}"),
    "tasks": (f"flows: {limits.MAX_TASKS_PER_SCHEDULE - 1}", f"flows: {limits.MAX_TASKS_PER_SCHEDULE}"),
}


def _variant(field: str, setting: str) -> str:
    text = ONE_RUN
    if field == "duration":
        return text.replace("duration: 5s", setting)
    if field == "qdisc_stats":
        return text.replace("interval: 10ms", setting)
    if field == "ss":
        return text.replace("tcp_probe: true", f"tcp_probe: true\n  {setting}")
    if field == "udp":
        return text.replace("tool: iperf3", f"tool: udp\n    {setting}")
    if field == "ports":
        return text.replace("flows: 1 ", f"{setting} ")
    return text.replace("flows: 1 ", f"{setting} ").replace("tcp_probe: true", "tcp_probe: false")


@pytest.mark.parametrize("field", sorted(AT_THE_LIMIT))
def test_the_loader_and_the_agents_refuse_at_the_same_value(field: str) -> None:
    at, over = (_variant(field, s) for s in AT_THE_LIMIT[field])
    assert at != ONE_RUN and over != ONE_RUN
    load_plan_text(at)          # the loader accepts the plan at the limit ...
    _schedule(at)               # ... and so does every agent
    issues = issues_of(over)    # one step over, the loader refuses it at load time ...
    print(field, issues)
    with pytest.raises(ValidationError):
        _schedule(over)         # ... as the agents would have, after the hosts were configured


def test_an_internal_error_is_one_located_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: object) -> None:
        raise RuntimeError("a bug\nover two lines")
    monkeypatch.setattr("orchestrator.plan.commands.load_plan", broken)
    out, err = io.StringIO(), io.StringIO()
    assert cmd_validate("x.yaml", out, err) == 70
    assert err.getvalue() == "x.yaml:1:1: (plan): internal error, please report: RuntimeError: a bug\\nover two lines\n"
