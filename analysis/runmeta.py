"""How analysis reads one stored run: its identity, the values the plan varied, and its RunSpec, read once.

Every value analysis takes from a run's spec is a typed property of `RunMeta` (the bottleneck rate and
base RTT, the flow count and CC of the main traffic, the AQM label, the analysis window settings, the
bottleneck capture point and qdisc link, the sender-side capture), so no other module reads spec or
derived keys. A stored spec that is missing or is not a RunSpec (a row a benchmark wrote, or one from a
tcplab whose RunSpec had other fields) reads as None, and so does every value taken from it. Pure: the
DB reading is in analysis/load.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from orchestrator.plan import AnalysisSpec, LinkRef, RunSpec
from schemas.hoststate import Htb, QdiscStage, Tbf

SHAPING_KINDS = frozenset({"htb", "tbf", "netem", "hfsc"})
"""Qdiscs that shape or delay; the AQM of a chain is its last stage of another kind."""
NO_AQM = "–"


def read_spec(stored: object) -> RunSpec | None:
    """The RunSpec of a stored run (the `spec` column), or None when there is none or it is not a RunSpec."""
    if not stored:
        return None
    try:
        return RunSpec.model_validate(stored)
    except ValidationError:
        return None


def bottleneck_of(spec: RunSpec | None) -> tuple[str | None, LinkRef | None]:
    """(capture point label, qdisc-stats link) of a run spec.

    The bottleneck link is the first qdisc_stats link; goodput is read at the capture on that link
    (downstream of the queue), else at the run's first capture point.
    """
    if spec is None:
        return None, None
    link = spec.qdisc_stats[0] if spec.qdisc_stats else None
    captures = [c.link for c in spec.captures]
    point = next((c.label for c in captures if c == link), None)
    if point is None and captures:
        point = captures[0].label
    return point, link


def sender_point_of(spec: RunSpec | None, sender: str, bottleneck_point: str | None) -> str | None:
    """The capture point on the sender's side of the bottleneck, for one-clock timing (M-RTT a, M-FCT,
    M-GAP): a capture on the sender itself, else the interface facing the sender (the aqm's ingress:
    data before the queue, ACKs after the return path), else any other capture, else the bottleneck's."""
    links = [c.link for c in spec.captures] if spec is not None else []
    for wanted in (lambda c: c.host == sender, lambda c: c.toward == sender,
                   lambda c: c.label != bottleneck_point):
        hit = next((c.label for c in links if wanted(c)), None)
        if hit is not None:
            return hit
    return bottleneck_point


def _chain(spec: RunSpec, link: LinkRef) -> list[QdiscStage]:
    host = spec.hosts.get(link.host)
    return list(host.qdiscs.get(link.toward, [])) if host is not None else []


@dataclass(frozen=True)
class RunMeta:
    """A run's identity, the values its plan varied (`params`, by the plan's own names: arm labels) and
    its RunSpec; tables, plots and metrics read the run's configuration through the properties below."""

    run_id: str
    status: str
    params: dict[str, Any]
    t0_ns: int | None
    duration_s: float
    plan_name: str = ""
    experiment: str = ""
    repetition: int = 0
    tags: tuple[str, ...] = ()
    spec: RunSpec | None = field(default=None, repr=False)
    flags: tuple[str, ...] = ()          # guard findings recorded with the run (G-CPULOAD, G-CLOCK, accepted ...)

    @property
    def capture_point(self) -> str | None:
        """Label of the capture goodput is read at (bottleneck_of)."""
        return bottleneck_of(self.spec)[0]

    @property
    def bottleneck(self) -> LinkRef | None:
        """The polled link whose qdisc is the bottleneck queue (bottleneck_of)."""
        return bottleneck_of(self.spec)[1]

    def sender_point(self, sender: str) -> str | None:
        return sender_point_of(self.spec, sender, self.capture_point)

    @property
    def cc(self) -> str:
        """The congestion control(s) of the run's main traffic group ('' without a spec)."""
        flows = self.spec.flows if self.spec is not None else []
        return "/".join(sorted({f.cc for f in flows if f.group == 0}))

    @property
    def flows(self) -> int | None:
        """Flows in the run's main traffic group (background groups not counted)."""
        return sum(1 for f in self.spec.flows if f.group == 0) if self.spec is not None else None

    @property
    def rate_bit(self) -> int | None:
        """The bottleneck rate: the plan's derived `bottleneck_rate_bit`, else (a plan that shapes with an
        explicit chain) the rate of the htb or tbf on the bottleneck link."""
        if self.spec is None:
            return None
        if self.spec.derived.bottleneck_rate_bit is not None:
            return self.spec.derived.bottleneck_rate_bit
        link = self.bottleneck
        chain = _chain(self.spec, link) if link is not None else []
        return next((s.rate_bit for s in chain if isinstance(s, Htb | Tbf)), None)

    @property
    def base_rtt_s(self) -> float | None:
        """The base RTT the plan states (base_rtt, else the bottleneck's netem delay), from the derived values."""
        rtt_us = self.spec.derived.base_rtt_us if self.spec is not None else None
        return rtt_us / 1e6 if rtt_us else None

    @property
    def analysis(self) -> AnalysisSpec:
        """The run's analysis settings (warm-up, window rule, measure length, bin); defaults without a spec."""
        return self.spec.analysis if self.spec is not None else AnalysisSpec()

    @property
    def aqm(self) -> str:
        """The AQM configuration, for grouping: a varied `queue` (kind and mode, e.g. `red-ramp`), a param the
        plan calls `aqm`, else the leaf qdisc of the first polled link's chain (`pfifo`); '–' if none."""
        queue = self.params.get("queue")
        if isinstance(queue, dict) and queue.get("kind"):
            return "-".join(str(queue[k]) for k in ("kind", "mode") if queue.get(k))
        if isinstance(self.params.get("aqm"), str):
            return self.params["aqm"]
        for link in self.spec.qdisc_stats if self.spec is not None else []:
            kinds = [s.kind for s in _chain(self.spec, link) if s.kind not in SHAPING_KINDS]
            if kinds:
                return str(kinds[-1])
        return NO_AQM
