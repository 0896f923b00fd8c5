"""Run order and `tcplab run` filters (orchestrator/engine/selection.py): pure, on a real expanded plan with two
kernel variants on the server, two arms, two congestion controls and two repetitions (order: rounds)."""
from __future__ import annotations

import pytest

from orchestrator.engine.selection import RunFilter, kernel_label, run_order, select_runs, unknown_filter_values
from orchestrator.plan import expand, load_plan_text

PLAN = """name: ko
roles: [client, aqm, server]
repetitions: 2
kernels:
  old: {package: linux-image-6.1.0-28-cloud-amd64, vanilla: true}
  new: {package: linux-image-6.12.9-cloud-amd64, vanilla: true}
run:
  duration: 2s
  bottleneck: {at: {host: aqm, toward: client}, rate: 20mbit, queue: {kind: pfifo, limit: 100}}
  traffic: {src: server, dst: client, cc: reno, flows: 1}
  hosts:
    all:
      offloads: {tso: off, gso: off, gro: off}
matrix:
  axes:
    hosts.server.kernel: [old, new]
    traffic.cc: [reno, cubic]
arms:
  - name: a
    set: {bottleneck.rate: 20mbit}
  - name: b
    set: {bottleneck.rate: 50mbit}
"""


def label(spec) -> str:
    return f"{spec.params['arm']}/{spec.params['kernel']}/{spec.params['cc']}/r{spec.repetition}"


@pytest.fixture(scope="module")
def specs():
    return expand(load_plan_text(PLAN, "ko.yaml"))


def test_the_plans_rounds_interleave_kernels(specs):
    """What the expansion gives (order: rounds): the kernel changes four times per round."""
    assert [label(s) for s in specs][:8] == [
        "a/old/reno/r0", "a/old/cubic/r0", "a/new/reno/r0", "a/new/cubic/r0",
        "b/old/reno/r0", "b/old/cubic/r0", "b/new/reno/r0", "b/new/cubic/r0"]


def test_run_order_groups_by_kernel_and_keeps_the_rounds_inside_a_group(specs):
    assert [label(s) for s in run_order(specs)] == [
        "a/old/reno/r0", "a/old/cubic/r0", "b/old/reno/r0", "b/old/cubic/r0",
        "a/old/reno/r1", "a/old/cubic/r1", "b/old/reno/r1", "b/old/cubic/r1",
        "a/new/reno/r0", "a/new/cubic/r0", "b/new/reno/r0", "b/new/cubic/r0",
        "a/new/reno/r1", "a/new/cubic/r1", "b/new/reno/r1", "b/new/cubic/r1"]
    switches = sum(1 for x, y in zip(run_order(specs), run_order(specs)[1:], strict=False)
                   if kernel_label(x) != kernel_label(y))
    assert switches == 1


def test_run_order_keeps_a_single_kernel_plan_exactly(specs):
    one = [s for s in specs if s.params["kernel"] == "new"]
    assert run_order(one) == one
    assert run_order([]) == []


def test_kernel_label_names_the_host_and_variant(specs):
    assert kernel_label(specs[0]) == "server=old"


@pytest.mark.parametrize(("f", "expected"), [
    (RunFilter(arms=("b",), kernels=("new",)), ["b/new/reno/r0", "b/new/cubic/r0", "b/new/reno/r1", "b/new/cubic/r1"]),
    (RunFilter(repetitions=(1,), kernels=("old",)),
     ["a/old/reno/r1", "a/old/cubic/r1", "b/old/reno/r1", "b/old/cubic/r1"]),
    (RunFilter(experiments=("main",), limit=3), ["a/old/reno/r0", "a/old/cubic/r0", "b/old/reno/r0"]),
    (RunFilter(arms=("a",), repetitions=(0,), kernels=("new",), limit=1),
     ["a/new/reno/r0"]),
    (RunFilter(limit=0), []),
    (RunFilter(arms=("a", "b"), repetitions=(1,), kernels=("old",)),
     ["a/old/reno/r1", "a/old/cubic/r1", "b/old/reno/r1", "b/old/cubic/r1"]),
    (RunFilter(arms=("b",), repetitions=(0, 1), kernels=("new", "old"), limit=3),
     ["b/old/reno/r0", "b/old/cubic/r0", "b/old/reno/r1"]),
])
def test_select_runs_narrows_the_run_order(specs, f, expected):
    assert [label(s) for s in select_runs(run_order(specs), f)] == expected


def test_no_filter_selects_everything(specs):
    assert select_runs(specs, RunFilter()) == specs


def test_unknown_filter_values_are_named_not_silently_empty(specs):
    ok = RunFilter(experiments=("main",), arms=("a",), repetitions=(1,), kernels=("old",))
    assert unknown_filter_values(specs, ok) == []
    wrong = RunFilter(experiments=("x", "main"), arms=("c",), repetitions=(2, 0), kernels=("k",))
    assert unknown_filter_values(specs, wrong) == [
        "--experiment x: the plan has no such experiment (it has: main)",
        "--arm c: the plan has no such arm (it has: a, b)",
        "--kernel k: the plan has no such kernel (it has: new, old)",
        "--rep 2: the plan's repetitions are 0..1"]


def test_the_cli_passes_the_filters_and_dry_run_to_run_plan(monkeypatch, tmp_path):
    """`tcplab run` wiring: every option reaches run_plan as a RunFilter (no lab, run_plan replaced)."""
    from orchestrator import cli
    from orchestrator.engine import plan_run

    seen = {}

    async def fake_run_plan(plan, **kw):
        seen.update(kw, plan=plan)
        return 3

    monkeypatch.setattr(plan_run, "run_plan", fake_run_plan)
    args = cli.build_parser().parse_args(["run", str(tmp_path / "p.yaml"), "--dry-run", "--experiment", "main",
                                          "--arm", "a,b", "--rep", "1", "--rep", "0,1", "--kernel", "old",
                                          "--limit", "2"])
    assert args.func(args) == 3
    assert seen["filters"] == RunFilter(experiments=("main",), arms=("a", "b"), repetitions=(1, 0),
                                        kernels=("old",), limit=2)
    assert (seen["dry"], seen["refresh"], seen["force"]) == (True, False, False)


def test_kernel_groups_follow_the_run_order_and_name_the_hosts_to_restart(specs):
    from orchestrator.engine.kernel_switch import HOME, kernel_groups, switches_needed
    from schemas import protocol

    ordered = run_order(specs)
    groups = kernel_groups(ordered)
    assert [s for g in groups for s in g] == ordered
    assert len(groups) == len({tuple(sorted((r, h.kernel.name) for r, h in s.hosts.items() if h.kernel))
                               for s in ordered})
    spec = groups[0][0]
    built = {role: h.kernel.model_copy(update={"release": "6.1.192-uml-0123456789", "build_key": "k" * 64})
             for role, h in spec.hosts.items() if h.kernel is not None}
    spec = spec.model_copy(update={"hosts": {r: h.model_copy(update={"kernel": built.get(r, h.kernel)})
                                             for r, h in spec.hosts.items()}})

    def caps(release: str) -> dict:
        return {r: protocol.Capabilities.model_construct(kernel_release=release) for r in spec.hosts}

    assert built and switches_needed(spec, caps("6.1.176")) == {"k" * 64: list(built)}
    assert switches_needed(spec, caps("6.1.192-uml-0123456789")) == {}
    # a host the run asks no kernel of goes back to the lab's own kernel if an earlier group left it elsewhere
    free = [r for r, h in spec.hosts.items() if h.kernel is None]
    if free:
        home = "6.1.192-uml-home000000"
        assert switches_needed(spec, caps("6.1.192-uml-0123456789"), home) == {HOME: free}
        on_home = {r: protocol.Capabilities.model_construct(
            kernel_release=home if r in free else "6.1.192-uml-0123456789") for r in spec.hosts}
        assert switches_needed(spec, on_home, home) == {}
    unasked = spec.model_copy(update={"hosts": {r: h.model_copy(update={"kernel": None})
                                                for r, h in spec.hosts.items()}})
    assert switches_needed(unasked, caps("6.1.192-uml-0123456789"), "6.1.192-uml-home000000") == {
        HOME: list(spec.hosts)}
    assert switches_needed(unasked, caps("6.1.192-uml-0123456789")) == {}     # no lab kernel known: left alone
    # a dry run judges a host that would be switched by its build's release, the rest of its hello as it is
    from orchestrator.engine.kernel_switch import as_switched

    now = caps("6.1.176")
    judged = as_switched(spec, now)
    assert {r: c.kernel_release for r, c in judged.items()} == {
        r: "6.1.192-uml-0123456789" if r in built else "6.1.176" for r in spec.hosts}
    assert as_switched(spec, caps("6.1.192-uml-0123456789")) == caps("6.1.192-uml-0123456789")


def test_a_repetition_that_is_not_a_number_is_a_usage_error(tmp_path, capsys):
    from orchestrator import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", str(tmp_path / "p.yaml"), "--rep", "0,x"])
    assert "--rep: invalid repetitions value: '0,x'" in capsys.readouterr().err
