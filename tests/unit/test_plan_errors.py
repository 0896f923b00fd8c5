"""Plan errors: every mistake is reported as FILE:LINE:COL: field.path: message, all at once."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from orchestrator.plan import Issue, PlanError, load_plan, load_plan_text
from orchestrator.plan.commands import cmd_expand, cmd_table, cmd_validate

PLANS = Path(__file__).resolve().parents[1] / "plans"
LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<path>\S+): (?P<msg>.+)$")


def issues_of(name: str) -> list[Issue]:
    with pytest.raises(PlanError) as info:
        load_plan(PLANS / name)
    return info.value.issues


def brief(issues: list[Issue]) -> list[tuple[int, int, str]]:
    return [(i.line, i.col, str(i).split(": ")[1]) for i in issues]


def test_unknown_field_points_at_the_key_and_suggests() -> None:
    (issue,) = issues_of("bad_unknown_field.yaml")
    assert (issue.line, issue.col) == (10, 5)
    assert issue.path == ("run", "traffic", "flowz")
    assert "unknown field 'flowz'" in issue.message and "did you mean 'flows'" in issue.message


def test_bad_units_all_reported_at_their_values() -> None:
    issues = issues_of("bad_unit.yaml")
    assert brief(issues) == [(5, 13, "run.base_rtt"), (8, 11, "run.bottleneck.rate"),
                             (9, 33, "run.bottleneck.queue.limit")]
    assert "needs a unit" in issues[0].message
    assert "megaBYTES" in issues[1].message
    assert "bits" in issues[2].message


def test_flow_longer_than_run() -> None:
    issues = issues_of("bad_flow_longer.yaml")
    assert brief(issues) == [(10, 15, "run.traffic.duration"), (10, 15, "run.traffic.duration"),
                             (12, 18, "run.traffic.per_flow[2].start")]
    assert "flow longer than the run" in issues[0].message
    assert "starts at 6s" in issues[2].message


def test_wrong_types() -> None:
    issues = issues_of("bad_wrong_type.yaml")
    assert brief(issues) == [(9, 12, "run.traffic.flows"), (10, 13, "run.captures"), (11, 10, "run.hosts")]
    assert "valid integer" in issues[0].message and "'two'" in issues[0].message
    assert "valid list" in issues[1].message and "mapping" in issues[1].message


def test_axis_values_are_checked_as_the_field_they_set() -> None:
    issues = issues_of("bad_axis_value.yaml")
    assert brief(issues) == [(12, 31, "matrix.axes['bottleneck.rate'][1]"),
                             (13, 5, "matrix.axes['traffic.flowz']")]
    assert "furlongs" in issues[0].message
    assert "did you mean 'flows'" in issues[1].message


def test_yaml_syntax_error_has_a_position() -> None:
    (issue,) = issues_of("bad_yaml_syntax.yaml")
    assert issue.line == 5 and "YAML syntax" in issue.message


def test_duplicate_key_is_an_error() -> None:
    (issue,) = issues_of("bad_duplicate_key.yaml")
    assert (issue.line, issue.col) == (5, 3) and "duplicate key 'duration'" in issue.message


def test_matrix_and_plan_rules() -> None:
    issues = issues_of("bad_matrix.yaml")
    assert brief(issues) == [(15, 12, "experiments[0].arms[0]"), (16, 11, "experiments[1].name"),
                             (19, 57, "experiments[1].matrix.zip[0].base_rtt"),
                             (21, 12, "experiments[1].matrix.exclude[0]['traffic.flows']")]
    assert "no arm named 'renoo'" in issues[0].message
    assert "duplicate experiment name" in issues[1].message
    assert "equally long" in issues[2].message


def test_problem_in_some_cells_names_the_cell() -> None:
    (issue,) = issues_of("bad_some_cells.yaml")
    assert issue.path == ("run", "traffic", "duration")
    assert "after the run ends at 2s" in issue.message and "1 of 2 cells" in issue.message
    assert "duration=2s" in issue.message


def test_roles_are_checked() -> None:
    issues = issues_of("bad_roles.yaml")
    paths = [str(i).split(": ")[1] for i in issues]
    assert paths == ["run.bottleneck.at.toward", "run.traffic.dst", "run.hosts.router",
                     "run.captures[0].toward"]
    assert (issues[2].line, issues[2].col) == (11, 5)   # the key of the unknown role


def test_conflicting_assignments_and_param_names() -> None:
    text = """
name: conflicts
run:
  duration: 5s
  traffic: {src: server, dst: client, cc: reno, flows: 1}
arms:
  - {name: a, set: {traffic.flows: 2}}
experiments:
  - name: x
    set: {traffic.cc: cubic}
matrix:
  axes:
    traffic.cc: [reno, bbr]
    traffic.per_flow.0.cc: [reno]
    hosts.client.sysctls.net.ipv4.tcp_ecn: [0]
    hosts.server.sysctls.net.ipv4.tcp_ecn: [1]
"""
    with pytest.raises(PlanError) as info:
        load_plan_text(text, "c.yaml")
    msgs = [str(i) for i in info.value.issues]
    assert any("experiments[0].set['traffic.cc']: also set by matrix.axes['traffic.cc']" in m for m in msgs)
    assert any("param name 'cc' would stand for" in m for m in msgs)
    assert any("param name 'tcp_ecn' would stand for" in m for m in msgs)


def test_every_issue_line_has_the_documented_shape() -> None:
    for plan in sorted(PLANS.glob("bad_*.yaml")):
        for issue in issues_of(plan.name):
            m = LINE.match(str(issue))
            assert m, str(issue)
            assert m["file"] == str(PLANS / plan.name)
            assert int(m["line"]) >= 1 and int(m["col"]) >= 1


def test_missing_file_and_non_mapping_root() -> None:
    with pytest.raises(PlanError, match="cannot read the plan"):
        load_plan(PLANS / "does-not-exist.yaml")
    with pytest.raises(PlanError, match="valid dictionary"):
        load_plan_text("- just\n- a list\n")
    with pytest.raises(PlanError, match="empty"):
        load_plan_text("# nothing here\n")


def test_yaml_traps_are_refused() -> None:
    # YAML 1.2 core schema: `on` is the text 'on' (so an unknown field here), a date is text, `010` is refused
    with pytest.raises(PlanError, match="unknown field 'on'"):
        load_plan_text("name: x\non: 1\n")
    with pytest.raises(PlanError, match="required field is missing") as info:
        load_plan_text("name: 2024-01-01\n")
    assert not any("name" in str(i.path) for i in info.value.issues)   # the name is read as the text
    with pytest.raises(PlanError, match="leading zero"):
        load_plan_text("name: x\nrepetitions: 010\n")
    with pytest.raises(PlanError, match="boolean"):
        load_plan_text("name: x\ntrue: 1\n")
    with pytest.raises(PlanError, match="recursive"):
        load_plan_text("a: &x [*x]\n")


def test_cli_exit_codes_and_streams() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert cmd_validate(PLANS / "bad_unit.yaml", out, err) == 2
    assert out.getvalue() == ""
    lines = err.getvalue().splitlines()
    assert len(lines) == 4 and lines[-1].endswith("3 problems")
    assert all(LINE.match(x) for x in lines[:-1])
    for cmd in (lambda o, e: cmd_expand(PLANS / "bad_unit.yaml", True, o, e),
                lambda o, e: cmd_table(PLANS / "bad_unit.yaml", o, e)):
        assert cmd(io.StringIO(), io.StringIO()) == 2


@pytest.mark.parametrize(("matrix", "where"), [
    ("matrix: {axes: {traffic.cc: [reno, cubic, reno]}}", "matrix.axes['traffic.cc'][2]"),
    ("matrix: {axes: {traffic.base_port: [5201, 5301]}, zip: [{base_rtt: [1ms, 1000us]}]}",
     "matrix.zip[0].base_rtt[1]"),
])
def test_repeated_axis_values_are_errors(matrix: str, where: str) -> None:
    text = "name: dup\nrun:\n  duration: 5s\n  traffic: {src: server, dst: client, cc: reno, flows: 1}\n"
    with pytest.raises(PlanError) as info:
        load_plan_text(text + matrix)
    (issue,) = info.value.issues
    assert str(issue).split(": ")[1] == where and "same value" in issue.message


def test_two_cells_giving_the_same_run_is_an_error() -> None:
    text = ("name: dup\nrun:\n  duration: 5s\n  traffic: {src: server, dst: client, cc: reno, flows: 1}\n"
            "matrix: {axes: {traffic.cc: [reno]}, include: [{traffic.flows: 1}]}\n")
    with pytest.raises(PlanError, match="gives the same run as another cell"):
        load_plan_text(text)
