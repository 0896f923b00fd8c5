"""The study file (docs/studies.md): a published study as tcplab replays it -- its plans and the part of each
that is replayed, the testbed profile, and the tables it reproduces with the paper's values, a tolerance per
cell and where each value was printed. A pydantic model like the plan's: unknown fields are errors, every field
documented with an example (`schemas/study.schema.json` is generated from it), problems reported as
FILE:LINE:COL by the loader.

A **table** has columns along one dimension (`experiment`, `arm` or a repetition `statistic`) and rows that each
select the other runs and name a metric (analysis/compare.py's keys, the same as campaign checks). A **cell** is
a row at a column: its runs' values of the metric, aggregated over repetitions by the statistic, beside the
paper's value. A **comparison** names arms whose difference is the study's claim: when the profile makes their
runs identical (both arms booted on one kernel) the comparison -- and every cell of its arms -- is not
reproducible on that testbed, whatever the dry run says about each run alone.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import StringConstraints

from orchestrator.plan.model.fields import Strict, _f

StudyName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")]
Label = Annotated[str, StringConstraints(min_length=1, max_length=80)]
MAX_PLANS = 16
MAX_TABLES = 32
MAX_ROWS = 64
MAX_COLUMNS = 64
MAX_SELECTED = 128
STATISTICS = ("mean", "median", "min", "max", "sd", "n")
Statistic = Literal["mean", "median", "min", "max", "sd", "n"]


class Tolerance(Strict):
    """How far a measured value may be from the paper's and still reproduce it: within `abs` or `rel` of the
    paper's value, whichever is wider."""

    rel: float = _f(0.0, "relative tolerance: a fraction of the paper's value", 0.2, ge=0, le=10)
    abs: float = _f(0.0, "absolute tolerance, in the row's unit (the paper's resolution is a good floor)", 32.768,
                    ge=0)


class PlanEntry(Strict):
    """One plan of the study and the part of it the study replays."""

    plan: str = _f(..., "the plan file, relative to the study file", "table-5-1.yaml", min_length=1, max_length=400)
    experiments: list[str] = _f([], "only these experiments (default: all)", ["1", "3A"], max_length=MAX_SELECTED)
    arms: list[str] = _f([], "only these arms (default: all)", ["reno-ramp-aimd"], max_length=MAX_SELECTED)
    repetitions: int | None = _f(None, "repetitions of each selected cell (default: the plan's)", 3, ge=1, le=50)


class Row(Strict):
    """One row of a table: which runs, which metric, the paper's value per column."""

    label: Label = _f(..., "the row as the paper names it", "Reno AIMD, mean")
    experiment: str | None = _f(None, "the row's experiment (when the columns are not experiments)", "thin-f4")
    arm: str | None = _f(None, "the row's arm (when the columns are not arms)", "reno-ramp-aimd")
    metric: str | None = _f(None, "the metric (default: the table's)", "qdelay_mean")
    statistic: Statistic | None = _f(None, "over repetitions (default: the table's)", "mean")
    paper: list[float | None] = _f(..., "the paper's value per column, null where it printed none", [555, 875],
                                   max_length=MAX_COLUMNS)
    tolerance: Tolerance | None = _f(None, "this row's tolerance (default: the table's)", {"rel": 0.25})


class Columns(Strict):
    """The table's columns: values along one dimension of the runs."""

    by: Literal["experiment", "arm", "statistic"] = _f(..., "what the columns are", "experiment")
    values: list[str] = _f(..., "the columns, in the paper's order", ["1", "2", "3A"], min_length=1,
                           max_length=MAX_COLUMNS)


class Table(Strict):
    """A table (or a figure's numbers) of the paper, in its layout."""

    id: Label = _f(..., "the table's id in the report (its CSV is study-NAME-ID.csv)", "table-9.1")
    title: str = _f(..., "what the table shows", "Mean queue delay, RED ramp, Reno, AIMD", max_length=300)
    source: str = _f(..., "where the paper prints it: table or figure, page", "Table 9.1, p. 97", max_length=200)
    plan: str = _f(..., "the plan (as in `plans:`) whose runs fill it", "table-5-1.yaml", max_length=400)
    metric: str = _f(..., "the metric of every row without its own (analysis/compare.py keys)", "qdelay_mean")
    unit: str = _f("", "the unit the paper prints", "µs", max_length=20)
    scale: float = _f(1.0, "metric value x scale = the paper's unit (qdelay_mean is in ms: 1000 for µs)", 1000,
                      gt=0)
    statistic: Statistic = _f("mean", "over a cell's repetitions", "mean")
    tolerance: Tolerance = _f(Tolerance(rel=0.1), "every row's tolerance unless it has its own",
                              {"rel": 0.2, "abs": 32.768})
    columns: Columns = _f(..., "what the columns are, in the paper's order",
                          {"by": "experiment", "values": ["1", "2", "3A"]})
    rows: list[Row] = _f(..., "the rows, in the paper's order", [{"label": "mean", "arm": "reno-ramp-aimd",
                                                                  "paper": [555]}],
                         min_length=1, max_length=MAX_ROWS)


class Comparison(Strict):
    """Arms whose difference the study claims: refused as a whole where the testbed erases it."""

    name: Label = _f(..., "the comparison", "cwnd accounting before and after Linux 3.16")
    plan: str = _f(..., "the plan (as in `plans:`)", "thin-stream.yaml", max_length=400)
    arms: list[str] = _f(..., "the arms compared", ["linux-3.15", "linux-3.18"], min_length=2, max_length=8)


class Study(Strict):
    """A study file (format version 1)."""

    version: Literal[1] = _f(1, "study format version", 1)
    name: StudyName = _f(..., "the study's name (`tcplab study run NAME`)", "lsaimd")
    title: str = _f(..., "the study", "LS-AIMD: sub-MSS congestion control", max_length=200)
    reference: str = _f(..., "the publication", "a thesis, 2019, chapters 5 and 9", max_length=400)
    profile: str | None = _f(None, "the testbed profile, relative to the study file (default: the UML lab's)",
                             "../profiles/uml-lab.yaml", max_length=400)
    plans: list[PlanEntry] = _f(..., "the plans and what of each is replayed", [{"plan": "table-5-1.yaml"}],
                                min_length=1, max_length=MAX_PLANS)
    tables: list[Table] = _f([], "the paper's tables this study reproduces", [], max_length=MAX_TABLES)
    comparisons: list[Comparison] = _f([], "the arms whose difference is the claim", [], max_length=16)
    notes: str = _f("", "what the study page says before its tables", "The AIMD rows only.", max_length=4000)
