"""The plan document: a run template plus the ways a study varies it (matrix, arms, experiments).

Variation is typed: every varied value is assigned to a dotted path into `RunTemplate`
(`bottleneck.rate`, `traffic.cc`, `hosts.all.sysctls.net.ipv4.tcp_ecn`) and re-validated as that field,
so there is no string templating. A run = template <- experiment `set` <- arm `set` <- matrix cell.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, JsonValue, PrivateAttr, StringConstraints

from orchestrator.plan.model.kernels import KernelVariant
from orchestrator.plan.model.names import VariantName
from orchestrator.plan.model.template import RoleName, RunTemplate, Strict, _f
from orchestrator.plan.model.topology import TopologySection

PlanName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}$")]
ItemName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,23}$")]


def _name_text(v: object) -> object:
    """Study tables name columns 1, 2, 3A: YAML reads the first two as integers."""
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else v


ColumnName = Annotated[ItemName, BeforeValidator(_name_text, json_schema_input_type=int | str)]
ParamName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]{0,47}$")]
FieldPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_-]+)*$")]
Assignments = dict[FieldPath, JsonValue]


class Matrix(Strict):
    """Runs = product over `axes` and `zip` groups, minus `exclude`, plus `include`."""

    axes: dict[FieldPath, Annotated[list[JsonValue], Field(min_length=1)]] = _f(
        {}, "field path -> list of values; the runs take every combination (first axis varies slowest)",
        {"traffic.cc": ["reno", "cubic"], "bottleneck.rate": ["20mbit", "50mbit"]})
    zip: list[dict[FieldPath, Annotated[list[JsonValue], Field(min_length=1)]]] = _f(
        [], "groups of equally long value lists that vary together (columns of a study table); each group "
        "is one axis of the product", [{"bottleneck.rate": ["200mbit", "600mbit"],
                                        "base_rtt": ["300us", "250us"]}])
    include: list[Assignments] = _f(
        [], "extra cells: field path -> value; fields not named keep the template value",
        [{"traffic.cc": "bbr", "traffic.flows": 1}])
    exclude: list[Assignments] = _f(
        [], "drop every cell whose axis values match all the given ones",
        [{"traffic.cc": "cubic", "traffic.flows": 2}])


class Arm(Strict):
    """A named set of values run together (e.g. a CC paired with its AQM), crossed with every cell."""

    name: ItemName = _f(..., "arm name (part of the run id)", "reno-ramp")
    description: str = _f("", "what the arm stands for", "Reno with RED ramp marking")
    set: Assignments = _f(..., "field path -> value", {"traffic.cc": "reno"}, min_length=1)


class Experiment(Strict):
    """A named column of a study table: overrides of the template, with its own matrix if needed."""

    name: ColumnName = _f(..., "experiment name (a study table column such as 1, 2, 3A ... 4H)", "3A")
    description: str = _f("", "what the experiment tests", "submss regime, 8 flows")
    set: Assignments = _f({}, "field path -> value for every run of the experiment",
                          {"bottleneck.rate": "200mbit", "base_rtt": "100us", "traffic.flows": 8})
    matrix: Matrix | None = _f(None, "replaces the plan's matrix for this experiment",
                               {"axes": {"traffic.cc": ["reno"]}})
    arms: list[ItemName] | None = _f(None, "names of the plan arms to run (default: all)", ["reno-ramp"])
    repetitions: int | None = _f(None, "replaces the plan's repetitions", 5, unit="runs", ge=1, le=1000)


class Plan(Strict):
    """A tcplab experiment plan (format version 1)."""

    # the directory of the file it was read from (load_plan), which its kernel file fields are relative to;
    # None for a plan read from text
    _source_dir: str | None = PrivateAttr(default=None)

    @property
    def source_dir(self) -> str | None:
        return self._source_dir

    def read_from(self, directory: str) -> Plan:
        """This plan, noting the directory of the file it was read from."""
        out = self.model_copy()
        out._source_dir = directory
        return out

    def __eq__(self, other: object) -> bool:
        # the fields only: where the file was is not what the plan is (pydantic compares private attributes too)
        return isinstance(other, Plan) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(tuple(self.__dict__.values()))

    version: Literal[1] = _f(1, "plan format version", 1)
    name: PlanName = _f(..., "plan name (first part of every run id)", "quickstart")
    description: str = _f("", "what the plan is for", "Reno vs CUBIC through an htb bottleneck")
    roles: list[RoleName] = _f(["client", "aqm", "server"], "host roles of the testbed",
                               ["client", "aqm", "server"], min_length=2)
    topology: TopologySection | None = _f(
        None, "hosts and the links between them; default derived from `roles` (docs/plans.md#topology)",
        {"links": [["sender_a", "aqm"], ["sender_b", "aqm"], ["aqm", "switch"], ["switch", "receiver_a"],
                   ["switch", "receiver_b"]], "switches": ["switch"]})
    tags: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9_-]{1,32}$")]] = _f(
        [], "labels stored with every run", ["smoke"])
    repetitions: int = _f(1, "runs per cell", 5, unit="runs", ge=1, le=1000)
    seed: int = _f(0, "base seed; each run's seed is derived from it, the cell and the repetition", 1,
                   ge=0, le=2**63 - 1)
    order: Literal["cells", "rounds", "random"] = _f(
        "rounds", "run order: `cells` runs all repetitions of a cell in a row; `rounds` runs repetition 0 "
        "of every cell, then repetition 1, ...; `random` shuffles each round with the plan seed", "rounds")
    param_names: dict[FieldPath, ParamName] = _f(
        {}, "field path -> name in the run params (default: the last path segment)",
        {"hosts.aqm.sysctls.net.ipv4.tcp_ecn": "aqm_ecn"})
    kernels: dict[VariantName, KernelVariant] = _f(
        {}, "kernel variants hosts may be asked to run (`hosts.<role>.kernel` names one)", {
            "vanilla-6.1": {"vanilla": True, "package": "linux-image-6.1.0-28-cloud-amd64"}})
    run: RunTemplate = _f(..., "the template every run starts from", {
        "duration": "5s", "traffic": {"src": "server", "dst": "client", "cc": "reno", "flows": 1}})
    matrix: Matrix = _f(Matrix(), "how runs vary: product of axes, zip groups, include/exclude",
                        {"axes": {"traffic.flows": [1, 2]}})
    arms: list[Arm] = _f([], "named value sets crossed with every cell", [
        {"name": "reno", "set": {"traffic.cc": "reno"}}])
    experiments: list[Experiment] = _f(
        [], "named experiments; none means one experiment called `main`", [
            {"name": "1", "set": {"traffic.flows": 1}}])


DEFAULT_EXPERIMENT = "main"
__all__ = ["Plan", "Matrix", "Arm", "Experiment", "Assignments", "DEFAULT_EXPERIMENT", "RoleName"]
