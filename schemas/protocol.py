"""The manager <-> agent protocol: typed messages, one model per op.

Wire format: JSON text frames. Requests `{"id", "op", "args"}`; replies `{"id", "result"}` or
`{"id", "error": {"code", "message", "field"}}`; agent pushes `{"event", "data"}`. Artifact bytes travel
as binary frames between an `artifact` event and the `collect` reply. The JSON Schema files under
`schemas/protocol/` are generated from these models (`python -m schemas.generate`; the task kinds of
`schedule` are in schemas/tasks.py) and a test keeps them in step; both sides validate every message against
those files at the boundary.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas import limits
from schemas.allowlist import DEFAULT_MODULES, DEFAULT_SYSCTL_PREFIXES
from schemas.handshake import NONCE_PATTERN
from schemas.hoststate import HostState
from schemas.identifiers import RUN_ID_PATTERN
from schemas.message import Msg as _Msg
from schemas.tasks import (  # noqa: F401 - the task kinds are part of the protocol (protocol.CaptureTask, ...)
    AppSinkTask,
    AppWriterTask,
    BulkFlow,
    BulkSenderTask,
    CaptureTask,
    CpuLoadTask,
    EventTask,
    Iperf3ClientTask,
    Iperf3ServerTask,
    KernelTraceTask,
    QdiscStatsTask,
    QueueTraceTask,
    SsSampleTask,
    Task,
    TcpProbeTask,
)

PROTOCOL_VERSION = 2   # 2: mutual authentication in hello (manager nonce, agent proof)
# a manager's name goes into the agent's log: no spaces, newlines or control characters that could forge a line
CLIENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$"


# ---------------------------------------------------------------- op arguments

class HelloArgs(_Msg):
    client: str = Field(pattern=CLIENT_NAME_PATTERN, description="manager identity, for the agent's log")
    nonce: str = Field(pattern=NONCE_PATTERN, description="the manager's fresh nonce: the agent's proof covers it")
    hmac: str = Field(pattern=r"^[0-9a-f]{64}$", description="schemas.handshake.manager_proof: HMAC-SHA256(token, "
                      "label | agent nonce | manager nonce | sha256 of the agent's TLS certificate or empty)")
    protocol: int = PROTOCOL_VERSION


class ApplyArgs(_Msg):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    state: HostState


class ClockArgs(_Msg):
    t1_ns: int = Field(description="manager CLOCK_REALTIME when the request was sent")


class ScheduleArgs(_Msg):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    tasks: list[Task] = Field(min_length=1, max_length=limits.MAX_TASKS_PER_SCHEDULE)


class CollectArgs(_Msg):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    timeout_s: float = Field(default=120, gt=0, le=limits.MAX_COLLECT_WAIT_S)


class Empty(_Msg):
    pass


OP_ARGS: dict[str, type[_Msg]] = {
    "hello": HelloArgs,
    "clock": ClockArgs,
    "apply": ApplyArgs,
    "schedule": ScheduleArgs,
    "status": Empty,
    "stop": Empty,
    "collect": CollectArgs,
    "reset": Empty,
    "bye": Empty,
}


class Request(_Msg):
    id: int = Field(ge=0)
    op: Literal["hello", "clock", "apply", "schedule", "status", "stop", "collect", "reset", "bye"]
    args: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- results

class KernelBuild(_Msg):
    """What playbooks/kernel-install.yml recorded when it installed the running kernel
    (/etc/tcplab/kernels/<release>.json on the host)."""
    release: str
    variant: str | None = None
    build_key: str | None = Field(None, description="the tcplab build key (docs/kernels.md); None for a "
                                  "distribution package")


class HostOS(_Msg):
    """The host's operating system: platform.uname() and /etc/os-release (schemas/hostos.py)."""
    system: str = Field(description="platform.uname().system: Linux, FreeBSD, ...")
    id: str = Field("", description="os-release ID (debian, ubuntu, freebsd); empty when there is none")
    version_id: str = Field("", description="os-release VERSION_ID")
    pretty: str = Field("", description="os-release PRETTY_NAME")


class LinkSpeed(_Msg):
    """The speed `ethtool IF` reports, and whether it says anything about the wire (G-NIC)."""
    mbps: int | None = Field(None, description="`Speed:` in Mb/s; None: Unknown!")
    checkable: bool = Field(False, description="a physical link's speed: a virtual driver's (veth, tun, virtio) "
                            "is a constant or unknown, never the wire's")
    why: str = Field("", description="why it is not checkable")


class Capabilities(_Msg):
    kernel_release: str
    kernel_build: KernelBuild | None = Field(None, description="the installed variant of the running kernel, "
                                             "when tcplab installed it")
    qdiscs: list[str] = Field(description="qdisc kinds the kernel really accepted when probed")
    congestion_controls: list[str] = Field(description="net.ipv4.tcp_available_congestion_control")
    allowed_congestion_controls: list[str]
    offload_features: dict[str, dict[str, bool]] = Field(
        description="per interface: feature (ethtool -k name) -> settable (not [fixed])")
    coalesce_params: dict[str, list[str]] = Field(
        default_factory=dict, description="per interface: ethtool -c parameters the driver has (empty: none)")
    pause_frames: dict[str, bool] = Field(default_factory=dict,
                                          description="per interface: the driver has pause-frame settings")
    drivers: dict[str, str] = Field(default_factory=dict, description="per interface: ethtool -i driver")
    # added with the host-state checks (docs/host-state.md); an older agent reports none of them
    os: HostOS | None = Field(None, description="the host's operating system")
    fixed_offloads: dict[str, dict[str, bool]] = Field(
        default_factory=dict, description="per interface: ethtool -K short name -> the value the driver fixed it "
        "at (`[fixed]`)")
    link_speeds: dict[str, LinkSpeed] = Field(default_factory=dict, description="per interface: `ethtool IF` speed")
    mtu_range: dict[str, tuple[int, int]] = Field(
        default_factory=dict, description="per interface: (min_mtu, max_mtu) from `ip -d -j link show`")
    tools: dict[str, str] = Field(description="tool -> version string")
    tracepoints: list[str] = Field(description="`system:event` tracepoints of the systems in "
                                   "schemas/ktrace.py TRACEPOINT_SYSTEMS that this kernel has")
    kprobe_events: bool = Field(False, description="tracefs has kprobe_events: kprobe/kretprobe pairs can time "
                                "functions (kernel_trace.kprobes)")
    tracers: list[str] = Field(default_factory=list, description="tracefs available_tracers (function_graph ...)")
    trace_printk_dest: bool = Field(False, description="an instance can take trace_printk output "
                                    "(options/trace_printk_dest); without it trace_printk goes to the top-level buffer")
    boot_id: str = Field("", description="/proc/sys/kernel/random/boot_id: hosts with the same one share a "
                         "kernel and its CPUs (netns lab)")
    tcp_delayed_acks: bool = Field(False, description="the sysctl net.ipv4.tcp_delayed_acks exists (patched "
                                   "kernels only; ack_policy mechanism tcp_delayed_acks_sysctl)")
    socket_diag: bool = Field(True, description="inet_diag answers for TCP (tcp_diag): `ss -ti` shows TCP_INFO "
                              "(without it ss reads /proc/net/tcp: no cwnd, no DCTCP alpha)")
    # an agent older than the allow-lists reports none: the manager then assumes the defaults
    allowed_sysctl_prefixes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SYSCTL_PREFIXES),
        description="sysctl prefixes this agent writes (schemas/allowlist.py; `{interface}` already expanded)")
    allowed_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_MODULES),
                                       description="kernel modules this agent loads and sets parameters of")
    loadable_modules: list[str] = Field(
        default_factory=list, description="allow-listed modules this agent has a file of in its module directories "
        "(--module-dir): it insmods them for a plan, e.g. a congestion control `tcp_X` (CC `X`) that "
        "`module_params` loads")


class HelloResult(_Msg):
    proof: str = Field(pattern=r"^[0-9a-f]{64}$", description="schemas.handshake.agent_proof over the same "
                       "nonces and binding: the agent knows the token too (the manager refuses an agent without it)")
    agent_version: str
    protocol: int
    hostname: str
    interfaces: list[str] = Field(description="the allow-listed data interfaces")
    capabilities: Capabilities


class InterfaceReadback(_Msg):
    tc_qdisc: list[dict[str, Any]] = Field(description="literal `tc -s -d -j qdisc show dev IF`")
    tc_class_text: str = Field(description="literal `tc -s -d class show dev IF`")
    htb_classes: list[dict[str, Any]] = Field(description="htb class parameters read over netlink")
    features: dict[str, dict[str, Any]] = Field(description="literal `ethtool --json -k IF` entries")
    driver: str = Field(default="", description="`ethtool -i IF` driver")
    coalesce: dict[str, int | bool] | None = Field(
        default=None, description="parsed `ethtool -c IF` (n/a parameters left out); None = not supported")
    pause: dict[str, bool] | None = Field(default=None, description="`ethtool --json -a IF`; None = not supported")
    unsupported: dict[str, str] = Field(default_factory=dict,
                                        description="ethtool operation -> the driver's refusal (e.g. coalesce)")
    neighbours: list[dict[str, Any]] = Field(default_factory=list, description="literal `ip -j neigh show dev IF`")
    mtu: int | None = Field(default=None, description="the interface's MTU (`ip -j link show`)")
    speed: LinkSpeed | None = Field(default=None, description="`ethtool IF` speed at apply (G-NIC)")
    raw_qdiscs: list[dict[str, str]] = Field(
        default_factory=list, description="qdiscs tc cannot print (kinds of tcplab's own modules, e.g. aqm_mark) "
        "from a netlink dump: handle, parent, kind, options_hex and xstats_hex (the kernel's bytes)")
    routes: dict[Literal["inet", "inet6"], list[dict[str, Any]]] = Field(
        default_factory=dict, description="family -> literal `ip -j -4|-6 route show dev IF` (the main table; "
        "`quickack 1` shows in `metrics`)")


class Readback(_Msg):
    kernel_release: str
    uname: dict[str, str] = Field(default_factory=dict, description="os.uname(): sysname, release, version, machine")
    congestion_controls: dict[str, list[str]] = Field(
        default_factory=dict, description="available / allowed congestion controls at apply time")
    sysctls: dict[str, str]
    module_params: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="module -> parameter -> value, for modules the plan configured")
    interfaces: dict[str, InterfaceReadback]


class ApplyResult(_Msg):
    readback: Readback


class ClockResult(_Msg):
    t2_ns: int
    t3_ns: int


class ScheduleResult(_Msg):
    accepted: list[str]


class TaskStatus(_Msg):
    task_id: str
    kind: str
    state: Literal["scheduled", "running", "done", "failed"]
    detail: str = ""
    guard: str | None = Field(default=None, pattern=r"^G-[A-Z0-9]+$",
                              description="the guard a remark on a finished task belongs to (G-CAPTURE)")


class StatusResult(_Msg):
    run_id: str | None
    tasks: list[TaskStatus]


class ArtifactInfo(_Msg):
    name: str
    task_id: str
    kind: str
    size: int
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    meta: dict[str, Any] = Field(default_factory=dict)


class CollectResult(_Msg):
    run_id: str
    artifacts: list[ArtifactInfo]
    tasks: list[TaskStatus]


class ResetResult(_Msg):
    restored: bool
    differences: list[str]


RESULTS: dict[str, type[_Msg]] = {
    "hello": HelloResult,
    "clock": ClockResult,
    "apply": ApplyResult,
    "schedule": ScheduleResult,
    "status": StatusResult,
    "stop": StatusResult,
    "collect": CollectResult,
    "reset": ResetResult,
    "bye": Empty,
}


class ErrorBody(_Msg):
    code: Literal["bad_request", "unauthenticated", "unknown_op", "invalid_args", "refused",
                  "failed", "busy", "protocol"]
    message: str
    field: str | None = None


class Reply(_Msg):
    id: int | None
    result: dict[str, Any] | None = None
    error: ErrorBody | None = None


class Event(_Msg):
    event: Literal["challenge", "artifact", "log", "task"]
    data: dict[str, Any]
