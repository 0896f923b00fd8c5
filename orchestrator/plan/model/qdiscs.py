"""Qdisc stages as a plan writes them (times, rates and sizes with units) and their kernel-unit form.

Two kinds of stage: a bottleneck `queue` (the leaf under the shaper: FIFO, RED, an AQM) and a stage of
an explicit chain (`hosts.<role>.qdiscs.<toward>`: netem, htb, tbf, fq, AQMs...). Every stage except RED
converts itself to its kind's stage (`schemas/qdiscs/`, kernel units) with `.state(mtu)`; RED thresholds
are written in time and need the bottleneck rate, so `build.bottleneck_chain` converts them
(docs/guards.md#g-red). A kind's tc argv, read-back, buffer and probe live with its stage there.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.quantities import (
    Fraction,
    PositiveBuffer,
    PositiveSize,
    PositiveThreshold,
    PositiveTime,
    Rate,
    Time,
)
from schemas import qdiscs as kinds


def _ns(t: Time | None) -> int | None:
    return t.value if t is not None else None


def _bytes(s: PositiveSize | None) -> int | None:
    return s.value if s is not None else None


def _per_256(hz: float | None) -> int | None:
    """A rate in Hz as sch_dualpi2 takes it, in 1/256 Hz, to the nearest (0.16 Hz -> 41, its default)."""
    return round(hz * 256) if hz is not None else None


class PfifoQueue(Strict):
    kind: Literal["pfifo"] = _f("pfifo", "packet-limited FIFO (tail drop)", "pfifo")
    limit: int = _f(..., "queue limit in packets", 100, unit="packets", gt=0, le=1_000_000)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002 - one signature for every stage
        return kinds.Pfifo(limit_packets=self.limit)


class BfifoQueue(Strict):
    kind: Literal["bfifo"] = _f("bfifo", "byte-limited FIFO (tail drop)", "bfifo")
    limit: PositiveBuffer = _f(..., "queue limit: bytes, or (as the bottleneck queue) a time at the "
                               "bottleneck rate or a multiple of the BDP", "1bdp")

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002 - run_rules allows only bytes off the bottleneck
        return kinds.Bfifo(limit_bytes=self.limit.in_bytes(None, None))


class HtbStage(Strict):
    kind: Literal["htb"] = _f("htb", "htb root with one default class shaping to `rate`", "htb")
    rate: Rate = _f(..., "class rate", "100mbit")
    ceil: Rate | None = _f(None, "class ceil (default: the rate)", "100mbit")
    burst: PositiveSize | None = _f(None, "class burst (default: rate x 1 ms, at least one frame)", "12500B")
    cburst: PositiveSize | None = _f(None, "class cburst (default: the burst)", "12500B")
    quantum: PositiveSize | None = _f(None, "class quantum (default: tc's, rate / r2q)", "1514B")

    def state(self, mtu: int) -> kinds.QdiscStage:
        from orchestrator.plan.model.frames import htb_burst_bytes
        burst = self.burst.value if self.burst else htb_burst_bytes(self.rate.value, mtu)
        return kinds.Htb(rate_bit=self.rate.value, ceil_bit=(self.ceil or self.rate).value, burst_bytes=burst,
                      cburst_bytes=self.cburst.value if self.cburst else burst, quantum_bytes=_bytes(self.quantum))


class TbfStage(Strict):
    kind: Literal["tbf"] = _f("tbf", "token bucket filter", "tbf")
    rate: Rate = _f(..., "token rate", "50mbit")
    burst: PositiveSize = _f(..., "bucket size", "32KiB")
    limit: PositiveSize = _f(..., "bytes that may wait for tokens", "150KB")

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.Tbf(rate_bit=self.rate.value, burst_bytes=self.burst.value, limit_bytes=self.limit.value)


class NetemStage(Strict):
    kind: Literal["netem"] = _f("netem", "netem delay line (e.g. on the ACK path)", "netem")
    delay: Time = _f(..., "constant delay added to every packet", "15ms")
    jitter: Time = _f("0s", "delay variation (+/-)", "1ms", validate_default=True)
    distribution: Literal["uniform", "normal", "pareto", "paretonormal"] | None = _f(
        None, "jitter distribution (default: tc's uniform)", "normal")
    loss: Fraction | None = _f(None, "random loss probability (a planned loss source)", "1%")
    limit: int = _f(..., "packets netem may hold; needs >= 1.5 x rate x delay / MTU (docs/guards.md"
                    "#g-netem), so it is stated explicitly here", 1000, unit="packets", gt=0, le=10_000_000)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.Netem(delay_ns=self.delay.value, jitter_ns=self.jitter.value, distribution=self.distribution,
                        loss=self.loss.value if self.loss else 0.0, limit_packets=self.limit)


class RedQueue(Strict):
    """RED with thresholds in time; expansion converts them to bytes at the bottleneck rate."""

    HASH_SKIP_IF_DEFAULT: ClassVar[frozenset[str]] = frozenset({"nodrop"})

    kind: Literal["red"] = _f("red", "RED marking/dropping queue", "red")
    mode: Literal["ramp", "step", "inst"] = _f(
        "ramp", "`ramp`: probability rises from 0 at min to `probability` at max on the averaged queue "
        "(burst by the rule of thumb); `step`: one threshold K = max(rate x min, 2 MTU), max = K + 1 B, "
        "probability 1, smallest burst; `inst`: a ramp min..max on the (nearly) instantaneous queue, "
        "smallest burst (docs/guards.md#g-red)", "ramp")
    min: PositiveThreshold = _f(..., "lower threshold (ramp, inst) or the step threshold K", "500us")
    max: PositiveThreshold | None = _f(None, "upper threshold (ramp and inst; must be above min)", "3target")
    limit: PositiveBuffer = _f("200ms", "buffer (hard limit): a time at the bottleneck rate, bytes or a "
                               "multiple of the BDP", "200ms", validate_default=True)
    probability: Fraction | None = _f(None, "marking probability at max (default: 10% ramp, 1 step; "
                                      "required for inst)", "10%")
    ecn: bool = _f(True, "mark ECN-capable packets instead of dropping them", True)
    adaptive: bool = _f(False, "adaptive RED (tunes max_p)", True)
    nodrop: bool = _f(False, "with ecn, queue packets that are not ECN-capable instead of dropping them "
                      "(tc-red nodrop): SYNs and retransmissions, which a standing queue above K would "
                      "otherwise drop (docs/guards.md#g-ecn)", True)
    avpkt: PositiveSize | None = _f(None, "average packet size (default: 1000 B ramp, the MTU step/inst)", 1000)
    burst: int | None = _f(None, "burst allowance in packets (default: (2 min + max) / (3 avpkt) for a "
                           "ramp, the smallest tc accepts for step and inst)", 2, unit="packets", gt=0, le=10**6)


class FqCodelQueue(Strict):
    kind: Literal["fq_codel"] = _f("fq_codel", "flow-queueing CoDel", "fq_codel")
    limit: int | None = _f(None, "packet limit (default: tc's 10240)", 10240, unit="packets", gt=0)
    flows: int | None = _f(None, "flow queues (default 1024)", 1024, unit="flows", gt=0)
    target: PositiveTime | None = _f(None, "target sojourn (default 5ms)", "5ms")
    interval: PositiveTime | None = _f(None, "interval (default 100ms)", "100ms")
    quantum: PositiveSize | None = _f(None, "DRR quantum (default: the MTU + 14)", "1514B")
    ce_threshold: PositiveTime | None = _f(None, "mark CE above this sojourn (L4S-style step)", "1ms")
    memory_limit: PositiveSize | None = _f(None, "memory limit (default 32MB)", "32MB")
    ecn: bool = _f(True, "mark instead of drop", True)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.FqCodel(limit_packets=self.limit, flows=self.flows, target_ns=_ns(self.target),
                          interval_ns=_ns(self.interval), quantum_bytes=_bytes(self.quantum),
                          ce_threshold_ns=_ns(self.ce_threshold), memory_limit_bytes=_bytes(self.memory_limit),
                          ecn=self.ecn)


class CodelQueue(Strict):
    kind: Literal["codel"] = _f("codel", "CoDel", "codel")
    limit: int | None = _f(None, "packet limit (default 1000)", 1000, unit="packets", gt=0)
    target: PositiveTime | None = _f(None, "target sojourn (default 5ms)", "5ms")
    interval: PositiveTime | None = _f(None, "interval (default 100ms)", "100ms")
    ce_threshold: PositiveTime | None = _f(None, "mark CE above this sojourn", "1ms")
    ecn: bool = _f(False, "mark instead of drop", True)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.Codel(limit_packets=self.limit, target_ns=_ns(self.target), interval_ns=_ns(self.interval),
                        ce_threshold_ns=_ns(self.ce_threshold), ecn=self.ecn)


class PieQueue(Strict):
    kind: Literal["pie"] = _f("pie", "PIE", "pie")
    limit: int | None = _f(None, "packet limit (default 1000)", 1000, unit="packets", gt=0)
    target: PositiveTime | None = _f(None, "target delay (default 15ms)", "15ms")
    tupdate: PositiveTime | None = _f(None, "probability update interval (default 15ms)", "15ms")
    alpha: int | None = _f(None, "alpha (default 2)", 2, unit="1/8", ge=0, le=32)
    beta: int | None = _f(None, "beta (default 20)", 20, unit="1/8", ge=0, le=32)
    ecn: bool = _f(False, "mark instead of drop", True)
    bytemode: bool = _f(False, "scale drop probability by packet size", False)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.Pie(limit_packets=self.limit, target_ns=_ns(self.target), tupdate_ns=_ns(self.tupdate),
                      alpha=self.alpha, beta=self.beta, ecn=self.ecn, bytemode=self.bytemode)


class FqPieQueue(Strict):
    kind: Literal["fq_pie"] = _f("fq_pie", "flow-queueing PIE", "fq_pie")
    limit: int | None = _f(None, "packet limit (default 10240)", 10240, unit="packets", gt=0)
    flows: int | None = _f(None, "flow queues (default 1024)", 1024, unit="flows", gt=0)
    target: PositiveTime | None = _f(None, "target delay (default 15ms)", "15ms")
    tupdate: PositiveTime | None = _f(None, "update interval (default 15ms)", "15ms")
    ecn: bool = _f(True, "mark instead of drop", True)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.FqPie(limit_packets=self.limit, flows=self.flows, target_ns=_ns(self.target),
                        tupdate_ns=_ns(self.tupdate), ecn=self.ecn)


class CakeQueue(Strict):
    kind: Literal["cake"] = _f("cake", "CAKE", "cake")
    bandwidth: Rate | None = _f(None, "CAKE's own shaper rate (default: unlimited, under htb)", "20mbit")
    rtt: PositiveTime | None = _f(None, "RTT CAKE assumes (default 100ms)", "100ms")
    flow_mode: Literal["flowblind", "srchost", "dsthost", "hosts", "flows", "dual-srchost", "dual-dsthost",
                       "triple-isolate"] | None = _f(None, "flow isolation (default triple-isolate)", "flows")
    diffserv: Literal["besteffort", "diffserv3", "diffserv4", "diffserv8", "precedence"] | None = _f(
        None, "tin layout (default diffserv3)", "besteffort")
    ack_filter: bool = _f(False, "drop redundant pure ACKs", False)
    overhead: int | None = _f(None, "per-packet overhead added for shaping", 18, unit="bytes", ge=-64, le=256)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.Cake(bandwidth_bit=self.bandwidth.value if self.bandwidth else None, rtt_ns=_ns(self.rtt),
                       flow_mode=self.flow_mode, diffserv=self.diffserv, ack_filter=self.ack_filter,
                       overhead_bytes=self.overhead)


class DualPi2Queue(Strict):
    kind: Literal["dualpi2"] = _f("dualpi2", "DualPI2 (L4S dual queue)", "dualpi2")
    limit: int | None = _f(None, "packet limit (default 10000)", 10000, unit="packets", gt=0)
    target: PositiveTime | None = _f(None, "classic queue target (default 15ms)", "15ms")
    tupdate: PositiveTime | None = _f(None, "update interval (default 16ms)", "16ms")
    alpha: float | None = _f(None, "PI integral gain (default 0.16 Hz; the kernel keeps it in 1/256 Hz)", 0.16,
                             unit="Hz", gt=0)
    beta: float | None = _f(None, "PI proportional gain (default 3.2 Hz; the kernel keeps it in 1/256 Hz)", 3.2,
                            unit="Hz", gt=0)
    step_thresh: PositiveTime | None = _f(None, "L queue step marking threshold (default 1ms)", "1ms")
    coupling_factor: int | None = _f(None, "coupling factor k (default 2)", 2, unit="ratio", gt=0, le=255)
    ecn_mask: Literal["l4s_ect", "any_ect"] | None = _f(None, "which ECT goes to the L queue", "l4s_ect")
    split_gso: bool | None = _f(None, "split GSO super-packets", True)

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.DualPi2(limit_packets=self.limit, target_ns=_ns(self.target), tupdate_ns=_ns(self.tupdate),
                          alpha=_per_256(self.alpha), beta=_per_256(self.beta),
                          step_thresh_ns=_ns(self.step_thresh), coupling_factor=self.coupling_factor,
                          ecn_mask=self.ecn_mask, split_gso=self.split_gso)


class FqStage(Strict):
    kind: Literal["fq"] = _f("fq", "fq: per-flow fair queueing and pacing (sender egress); overrides the "
                             "stack's internal pacing (docs/guards.md#g-cc)", "fq")
    limit: int | None = _f(None, "packet limit (default 10000)", 10000, unit="packets", gt=0)
    flow_limit: int | None = _f(None, "per-flow packet limit (default 100)", 100, unit="packets", gt=0)
    quantum: PositiveSize | None = _f(None, "credit per round (default 2 MTU)", "3028B")
    initial_quantum: PositiveSize | None = _f(None, "credit of a new flow (default 10 MTU)", "50000B")
    maxrate: Rate | None = _f(None, "per-flow rate cap", "50mbit")
    pacing: bool = _f(True, "pace flows at sk_pacing_rate", True)
    ce_threshold: PositiveTime | None = _f(None, "mark CE above this sojourn", "1ms")

    def state(self, mtu: int) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.Fq(limit_packets=self.limit, flow_limit_packets=self.flow_limit,
                     quantum_bytes=_bytes(self.quantum), initial_quantum_bytes=_bytes(self.initial_quantum),
                     maxrate_bit=self.maxrate.value if self.maxrate else None, pacing=self.pacing,
                     ce_threshold_ns=_ns(self.ce_threshold))


class MarkQueue(Strict):
    kind: Literal["mark"] = _f("mark", "tcplab's `aqm-mark` qdisc (needs that kernel variant on the host): CE "
                               "marking on the instantaneous sojourn time or EST, step or linear ramp, no "
                               "averaging (experiments/README.md#dctcp-flaws)", "mark")
    mode: Literal["step", "ramp"] = _f(..., "step at `min`, or probability 0 -> 1 from `min` to `max`", "step")
    min: PositiveThreshold = _f(..., "step threshold or ramp start", "2ms")
    max: PositiveThreshold | None = _f(None, "ramp end (ramp only)", "4ms")
    metric: Literal["sojourn", "est"] = _f("sojourn", "what is compared with the thresholds: the packet's "
                                           "sojourn, or the expected service time of the backlog", "sojourn")
    on_dequeue: bool = _f(True, "decide at dequeue (at enqueue when false)", True)
    limit: int = _f(10000, "packet limit", 10000, unit="packets", gt=0)

    def state(self, mtu: int, rtt_ns: int | None = None, target_ns: int | None = None) -> kinds.QdiscStage:  # noqa: ARG002
        return kinds.Mark(mode=self.mode, min_ns=self.min.in_ns(rtt_ns, target_ns),
                       max_ns=self.max.in_ns(rtt_ns, target_ns) if self.max else None, metric=self.metric,
                       on_dequeue=self.on_dequeue, limit_packets=self.limit)


AQM_QUEUES = (FqCodelQueue | CodelQueue | PieQueue | FqPieQueue | CakeQueue | DualPi2Queue | MarkQueue)
Queue = Annotated[PfifoQueue | BfifoQueue | RedQueue | AQM_QUEUES, Field(discriminator="kind")]
Stage = Annotated[HtbStage | TbfStage | PfifoQueue | BfifoQueue | NetemStage | FqStage | AQM_QUEUES,
                  Field(discriminator="kind")]
