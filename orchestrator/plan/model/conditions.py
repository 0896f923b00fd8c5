"""Run conditions beyond host state: the receiver's ACK policy, timed events and analysis windows.

Each is something the studies left implicit and paid for (docs/guards.md: G-ACK, G-FAULT, G-WINDOW), so
a plan states it and the run record keeps it.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.names import RoleName
from orchestrator.plan.model.quantities import Fraction, PositiveTime, Rate, Time


class AckPolicy(Strict):
    """How receivers acknowledge, and the mechanism that makes them do so."""

    mode: Literal["per_segment", "delayed", "stretch"] = _f(
        ..., "`per_segment`: one ACK per data segment; `delayed`: the stack's delayed ACKs; `stretch`: one "
        "ACK per `segments_per_ack` segments", "per_segment")
    mechanism: Literal["quickack_route", "tcp_delayed_acks_sysctl", "module_param", "stock"] = _f(
        ..., "`quickack_route`: `ip route change ... quickack 1` on the receiver; `tcp_delayed_acks_sysctl`: "
        "a patched kernel's net.ipv4.tcp_delayed_acks; `module_param`: a module parameter of the kernel "
        "variant; `stock`: nothing changed", "quickack_route")
    segments_per_ack: int = _f(1, "segments acknowledged per ACK (delta; 2 for the LS-AIMD Exp 3B stretch "
                               "ACKs)", 2, unit="segments", ge=1, le=64)
    hosts: list[RoleName] | None = _f(None, "receiving roles it applies to (default: every flow's dst)",
                                      ["receiver"])


class Event(Strict):
    """A timed action an agent performs at an absolute time during the run and records with its timestamps
    (docs/plans.md "Events")."""

    at: Time = _f(..., "when, from T0", "20s")
    action: Literal["ack_blackout", "set_delay", "set_loss", "set_rate", "stop_flows"] = _f(
        ..., "`ack_blackout`: drop the host's outgoing packets on the interface for `duration`; `set_delay`: "
        "change the netem delay of the interface's chain to `delay` (an RTT step); `set_loss`: change its netem "
        "loss to `loss`; `set_rate`: change the htb rate (and ceil) of the chain's shaper to `rate`; "
        "`stop_flows`: stop the host's flows of traffic group `group`", "ack_blackout")
    host: RoleName = _f(..., "role of the host that acts (stop_flows: the sender of the flows)", "receiver")
    toward: RoleName | None = _f(None, "interface of the action (the role it faces); not for stop_flows", "aqm")
    duration: PositiveTime | None = _f(None, "how long the action lasts (ack_blackout)", "1s")
    delay: Time | None = _f(None, "new netem delay (set_delay)", "100ms")
    loss: Fraction | None = _f(None, "new netem random loss probability (set_loss)", "1%")
    rate: Rate | None = _f(None, "new htb rate and ceil (set_rate)", "5mbit")
    group: int | None = _f(None, "traffic group whose flows stop (stop_flows): 0 = the main traffic, k = "
                           "background[k-1]", 1, unit="group", ge=0, le=64)

    # fields added with the executed events: left out of the run hash when unset, so runs keep their ids
    HASH_SKIP_IF_DEFAULT: ClassVar[frozenset[str]] = frozenset({"loss", "rate", "group"})


EVENT_FIELDS = {"ack_blackout": "duration", "set_delay": "delay", "set_loss": "loss", "set_rate": "rate",
                "stop_flows": "group"}
"""The one parameter field each action needs; the others have no meaning for it."""


class Analysis(Strict):
    """Windows the analysis uses for this run (stored with each result)."""

    warmup: Time = _f("0s", "excluded from the start of the run", "2s", validate_default=True)
    measure: PositiveTime | None = _f(None, "length of the measurement window after the warm-up "
                                      "(default: to the end)", "120s")
    window: Literal["all_flows_active", "run"] = _f(
        "all_flows_active", "queue statistics cover the interval in which every flow is active, or the "
        "whole run (after the warm-up)", "all_flows_active")
    bin: PositiveTime | None = _f(None, "throughput bin width (default 100 ms; LS-AIMD averages 10 ms)",
                                  "10ms")
    bin_rtts: float | None = _f(None, "throughput bin width in base RTTs instead (Paced Chirping 1, DCTCP "
                                "flaws 2)", 2, unit="base RTTs", gt=0, le=1000)
