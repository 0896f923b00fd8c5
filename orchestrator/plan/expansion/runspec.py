"""RunSpec: one run with every value in kernel units, the output of plan expansion and the input of the run
engine. Its parts are named `...Spec` (HostSpec, FlowSpec, ...): the per-run stage of a plan section.

Hosts are plan roles (`client`, `aqm`, `server`, ...); interfaces are named by the role of the peer
they face (`toward`), so a RunSpec is testbed-independent. The engine binds roles and `toward`
references to the inventory the lab (or a physical testbed) provides; a HostSpec becomes the
`schemas.hoststate.HostState` an agent applies.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from orchestrator.plan.model.topology import default_links
from schemas.hoststate import QdiscStage
from schemas.identifiers import RUN_ID_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkRef(_Strict):
    host: str = Field(description="role of the host owning the interface")
    toward: str = Field(description="role of the peer at the other end of the link")

    @property
    def label(self) -> str:
        return f"{self.host}:to-{self.toward}"


class KernelRef(_Strict):
    """The kernel variant a host must run: its label, expected release and content hash (G-VARIANT)."""

    name: str
    vanilla: bool
    release: str | None = Field(default=None, description="expected `uname -r`; None for a build whose "
                                "release is known only after it is built")
    sha256: str = Field(description="hash of the variant's definition")
    build_key: str | None = Field(default=None, description="the tcplab build of a source variant the run "
                                  "expects (docs/kernels.md); left out of the JSON when none")

    @model_serializer(mode="wrap")
    def _build_key_if_any(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("build_key", "") is None:
            del out["build_key"]
        return out


class HostSpec(_Strict):
    """One role's host settings for one run: the plan's `all` and role sections merged, qdisc chains in
    kernel units (the bottleneck's included), interfaces still named by the role they face."""

    kernel: KernelRef | None = None
    module_params: dict[str, dict[str, str]] = Field(default_factory=dict,
                                                     description="module -> parameter -> value")
    sysctls: dict[str, str] = Field(default_factory=dict)
    offloads: dict[str, bool] = Field(default_factory=dict, description="applied to every data interface")
    coalesce: dict[str, int | bool] = Field(default_factory=dict, description="ethtool -C, every data interface")
    pause: dict[str, bool] = Field(default_factory=dict, description="ethtool -A, every data interface")
    qdiscs: dict[str, list[QdiscStage]] = Field(
        default_factory=dict, description="toward-role -> qdisc chain on that interface")
    flush_tcp_metrics: bool = True
    static_neighbours: bool = True
    os: Literal["linux", "freebsd"] | None = Field(default=None, description="the operating system the plan "
                                                   "names for the host (None: any, left out of the JSON)")

    @model_serializer(mode="wrap")
    def _os_if_named(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("os", "") is None:
            del out["os"]
        return out


class FlowSpec(_Strict):
    flow_id: int = Field(ge=0)
    src: str = Field(description="sending role")
    dst: str = Field(description="receiving role")
    cc: str
    start_s: float = Field(ge=0, description="offset from T0")
    duration_s: float = Field(gt=0)
    port: int = Field(ge=1024, le=65535, description="receiver port; unique per flow in a run")
    tool: Literal["iperf3", "udp", "app_limited", "bulk"] = "iperf3"
    group: int = Field(default=0, ge=0, description="0 = the main traffic, k = background[k-1]")
    bytes: int | None = Field(default=None, gt=0, description="stop after this many bytes")
    rate_bit: int | None = Field(default=None, gt=0, description="sending rate (udp)")
    write_size: int | None = Field(default=None, gt=0, description="bytes per write (app_limited)")
    write_interval_s: float | None = Field(default=None, gt=0, description="seconds between writes")
    write_interval_dist: Literal["exponential"] | None = Field(
        default=None, description="None: fixed gaps; exponential gaps of mean write_interval_s (app_limited); "
        "left out of the JSON when None, so specs (and run ids) of earlier plans stay as they were")
    nodelay: bool = False

    @model_serializer(mode="wrap")
    def _dist_if_any(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("write_interval_dist", "") is None:
            del out["write_interval_dist"]
        return out


class AckPolicySpec(_Strict):
    mode: Literal["per_segment", "delayed", "stretch"]
    mechanism: Literal["quickack_route", "tcp_delayed_acks_sysctl", "module_param", "stock"]
    segments_per_ack: int = 1
    hosts: list[str]


class EventSpec(_Strict):
    at_s: float = Field(ge=0)
    action: Literal["ack_blackout", "set_delay", "set_loss", "set_rate", "stop_flows"]
    link: LinkRef | None = Field(None, description="the interface acted on (None for stop_flows)")
    host: str = Field("", description="the acting host's role")
    duration_s: float | None = None
    delay_ns: int | None = None
    loss: float | None = None
    rate_bit: int | None = None
    group: int | None = None


class KernelTraceSpec(_Strict):
    """Kernel-side timing on some hosts (plan `kernel_trace`, docs/plans.md#kernel_trace): timing runs (G-PROBE)."""

    hosts: list[str]
    trace_printk: bool = False
    tracepoints: dict[str, str | None] = Field(default_factory=dict, description="`system:event` -> filter or None")
    kprobes: list[str] = Field(default_factory=list, description="symbols timed by a kprobe + kretprobe pair")
    function_graph: list[str] = Field(default_factory=list, description="symbols timed by the function_graph "
                                      "tracer (not executed by this agent version: refused at preflight)")
    buffer_kib: int = 16384


class AnalysisSpec(_Strict):
    warmup_s: float = 0.0
    measure_s: float | None = None
    window: Literal["all_flows_active", "run"] = "all_flows_active"
    bin_s: float | None = None
    bin_rtts: float | None = None


class CapturePoint(_Strict):
    link: LinkRef
    snaplen: int = 128


class Derived(_Strict):
    """Values the expansion computes from the stated ones (`expansion/derive.py`), in kernel units: each name
    carries its unit. Only the values that apply to the run are set (no bottleneck: only the frame size; no
    RED: no red_*); unset ones are left out of the JSON, so a stored spec reads back as it was written."""

    wire_frame_bytes: int | None = Field(None, description="a full-size packet in the qdisc's accounting: MTU + "
                                         "14 (always set by the expansion)")
    bottleneck_rate_bit: int | None = Field(None, description="bottleneck rate (htb rate and ceil)")
    line_rate_bit: int | None = Field(None, description="interface speed netem sees before the shaper")
    htb_burst_bytes: int | None = Field(None, description="htb burst and cburst: stated, or rate x 1 ms, at least "
                                        "one frame (G-HTB)")
    queue_capacity_bytes: int | None = Field(None, description="largest backlog the leaf queue holds (unset for "
                                             "CAKE, which only a memory limit bounds)")
    queue_capacity_ms: float | None = Field(None, description="that backlog as time at the bottleneck rate")
    netem_limit_packets: int | None = Field(None, description="netem limit of the bottleneck delay: stated or "
                                            "derived (G-NETEM)")
    netem_limit_rule_packets: int | None = Field(None, description="ceil(1.5 x line rate x delay / MTU) + the "
                                                 "leaf's buffer in packets (with a line rate)")
    netem_limit_below_rule: bool | None = Field(None, description="the netem limit is below that rule")
    red_min_us: float | None = Field(None, description="RED lower threshold (the step's K) in time")
    red_min_bytes: int | None = Field(None, description="RED lower threshold in bytes at the bottleneck rate")
    red_max_us: float | None = Field(None, description="RED upper threshold in time (ramp and inst)")
    step_k_bytes: int | None = Field(None, description="step threshold K = max(rate x K time, 2 MTU) (RED step, "
                                     "mark step)")
    red_max_bytes: int | None = Field(None, description="RED upper threshold in bytes (step: K + 1)")
    red_limit_bytes: int | None = Field(None, description="RED hard limit in bytes")
    red_avpkt_bytes: int | None = Field(None, description="RED average packet size")
    red_burst_packets: int | None = Field(None, description="RED burst allowance")
    red_probability: float | None = Field(None, description="RED marking probability at max")
    window_segments_at_min: float | None = Field(None, description="per-flow window in segments with the queue "
                                                 "at RED min")
    window_segments_at_max: float | None = Field(None, description="per-flow window in segments with the queue "
                                                 "at RED max")
    marking_queue_bytes: int | None = Field(None, description="the queue the flows of a marking AQM top out at "
                                            "(its upper threshold in bytes)")
    target_us: float | None = Field(None, description="queue delay the AQM aims for (bottleneck.target or the "
                                    "AQM's lower threshold / target; 0 for none)")
    base_rtt_us: float | None = Field(None, description="base RTT: base_rtt, else the bottleneck netem delay")
    bdp_bytes: int | None = Field(None, description="bandwidth-delay product at the bottleneck rate")
    queue_capacity_bdp: float | None = Field(None, description="queue capacity in BDPs")
    per_flow_window_segments: float | None = Field(None, description="rate / (N x (MTU + 18) x 8) x (base RTT + "
                                                   "target), N = TCP flows")
    submss: bool | None = Field(None, description="that window is below 2 segments (G-FLOOR)")
    floor_queue_us: float | None = Field(None, description="standing queue the 2-segment cwnd floor implies "
                                         "(G-FLOOR)")

    @model_serializer(mode="wrap")
    def _set_values_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        values = {k: v for k, v in handler(self).items() if v is not None}
        if "step_k_bytes" not in values or "red_min_bytes" in values:
            return values
        # a `mark` step: its K is derived from the marking queue and has always been written after it
        # (a RED step writes K before it, as the field order has it); stored specs keep their key order
        k = values.pop("step_k_bytes")
        out: dict[str, Any] = {}
        for name, value in values.items():
            out[name] = value
            if name == "marking_queue_bytes":
                out["step_k_bytes"] = k
        return out


class Substitution(_Strict):
    """One change a testbed profile made to the plan's run (expansion/adapt.py)."""

    kind: Literal["kernel", "rate", "time", "capture"]
    field: str = Field(description="what changed: `kernels.<variant>`, a run template field path, a capture point")
    was: str
    now: str
    why: str = ""


class ProfileRef(_Strict):
    """The testbed profile a run was adapted with (docs/profiles.md)."""

    name: str
    sha256: str = Field(description="digest of what the profile does (its description aside)")
    scale_factor: float = Field(1.0, description="the factor every rate of the run's experiment was multiplied by")


class TopologySpec(_Strict):
    """The testbed the run needs: the plan's `topology:` or the default its roles give (model/topology.py)."""

    hosts: list[str] = Field(description="roles, one agent each")
    switches: list[str] = Field(default_factory=list, description="L2 switches (no agent, no address)")
    links: list[tuple[str, str]] = Field(description="pairs of nodes; one subnet per link or per switch")


class RunSpec(_Strict):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    plan_name: str
    experiment: str
    tags: list[str] = Field(default_factory=list, description="the plan's tags (report selection `tag:`, G-VM)")
    cell: int = Field(default=0, description="matrix cell within the experiment (shared by its arms)")
    repetition: int = 0
    seed: int = 0
    params: dict[str, Any] = Field(description="the matrix values that define this run")
    derived: Derived = Field(default_factory=Derived, description="values computed at expansion")
    duration_s: float = Field(gt=0)
    hosts: dict[str, HostSpec]
    topology: TopologySpec | None = Field(default=None, description="the plan's stated topology; None: the "
                                          "default its roles give (`testbed`), left out of the JSON so specs "
                                          "stored before topologies read and write back unchanged")
    flows: list[FlowSpec]
    captures: list[CapturePoint]
    qdisc_stats: list[LinkRef] = Field(default_factory=list)
    qdisc_stats_interval_ms: int = 10
    tcp_probe: bool = True
    ss_interval_ms: int | None = Field(default=None, description="poll `ss -tinH` on the senders (None: off)")
    ack_policy: AckPolicySpec | None = None
    kernel_trace: KernelTraceSpec | None = Field(default=None, description="kernel-side timing (left out of the "
                                                 "JSON without it)")
    events: list[EventSpec] = Field(default_factory=list)
    analysis: AnalysisSpec = AnalysisSpec()
    accept_guards: list[str] = Field(default_factory=list, description="guards this run may trip (recorded)")
    profile: ProfileRef | None = Field(default=None, description="the testbed profile the run was adapted with "
                                       "(left out of the JSON without one)")
    substitutions: list[Substitution] = Field(default_factory=list, description="every change the profile made "
                                              "to this run (left out of the JSON when none)")

    @property
    def mtu(self) -> int:
        """The run's MTU: the wire frame less its Ethernet header (the expansion always derives the frame)."""
        return (self.derived.wire_frame_bytes or 1514) - 14

    @property
    def senders(self) -> list[str]:
        return sorted({f.src for f in self.flows})

    @property
    def testbed(self) -> TopologySpec:
        """The hosts and links the run needs: the stated topology, or the default of its roles (plan order)."""
        if self.topology is not None:
            return self.topology
        links, switches = default_links(list(self.hosts))
        return TopologySpec(hosts=list(self.hosts), switches=list(switches), links=list(links))

    @model_serializer(mode="wrap")
    def _stated_values_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Fields added after runs were stored are left out while unset: stored specs read and write back
        unchanged."""
        out = handler(self)
        for name, unset in (("topology", None), ("profile", None), ("substitutions", []), ("kernel_trace", None)):
            if out.get(name, unset) == unset and name in out:
                del out[name]
        return out
