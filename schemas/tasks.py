"""The scheduled task kinds of the `schedule` op (schemas/protocol.py): each starts at an absolute
CLOCK_REALTIME time on the agent (agents/tasks.py RUNNERS holds one runner per kind)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from schemas import ktrace, limits
from schemas.events import PLAN_ACTIONS, EventAction
from schemas.identifiers import TASK_ID_PATTERN
from schemas.message import Msg as _Msg
from schemas.strings import InterfaceName, IPAddress

__all__ = ["AppSinkTask", "AppWriterTask", "BulkFlow", "BulkSenderTask",
           "CaptureTask", "CpuLoadTask", "EventTask", "Iperf3ClientTask",
           "Iperf3ServerTask", "KernelTraceTask", "QdiscStatsTask", "QueueTraceTask", "SsSampleTask", "Task",
           "TcpProbeTask"]


class _TaskBase(_Msg):
    task_id: str = Field(pattern=TASK_ID_PATTERN)
    start_ns: int = Field(description="absolute CLOCK_REALTIME start time")


class Iperf3ServerTask(_TaskBase):
    kind: Literal["iperf3_server"] = "iperf3_server"
    port: int = Field(ge=1024, le=65535)


class Iperf3ClientTask(_TaskBase):
    kind: Literal["iperf3_client"] = "iperf3_client"
    port: int = Field(ge=1024, le=65535)
    dst_addr: IPAddress = Field(description="the server's address (iperf3 -c)")
    cc: str = Field(pattern=r"^[a-z0-9_]{1,32}$")
    duration_s: float = Field(gt=0, le=limits.MAX_RUN_SECONDS,
                              description="send for this long (unless `bytes` is set)")
    interval_s: float = Field(default=0.1, ge=limits.MIN_REPORT_INTERVAL_S, le=limits.MAX_REPORT_INTERVAL_S)
    bytes: int | None = Field(default=None, gt=0, description="send this many bytes, then stop (iperf3 -n)")
    udp_rate_bit: int | None = Field(default=None, gt=0, le=limits.MAX_UDP_RATE_BIT,
                                     description="UDP at this rate instead of TCP")
    nodelay: bool = Field(default=False, description="TCP_NODELAY (iperf3 -N)")


def iperf3_connect_timeout_ms(duration_s: float) -> int:
    """How long an iperf3 client waits for its connection: half its duration, 3-30 s. Long enough for the
    kernel's SYN retransmissions at 1, 3, 7 and 15 s: a flow joining a queue whose average sits above a RED
    maximum loses every SYN there (a SYN is not ECN-capable; LS-AIMD 3A and 4E lost them for more than 10 s)
    and would otherwise fail the run instead of starting late, which M-STARTSKEW shows. The engine's tail bound
    covers it, so a client that connected late still ends before the passive tasks are stopped."""
    return int(min(30_000, max(3_000, duration_s * 500)))


class CaptureTask(_TaskBase):
    kind: Literal["capture"] = "capture"
    interface: InterfaceName
    stop_ns: int
    snaplen: int = Field(default=128, ge=96, le=65535)
    buffer_kib: int = Field(default=32768, ge=1024)


class TcpProbeTask(_TaskBase):
    kind: Literal["tcp_probe"] = "tcp_probe"
    ports: list[int] = Field(min_length=1, max_length=limits.MAX_PORTS_PER_SAMPLER)
    stop_ns: int
    buffer_kib: int = Field(default=16384, ge=1024)


class QueueTraceTask(_TaskBase):
    """net:net_dev_queue and net:net_dev_xmit on one interface, in a private tracefs instance: when each packet
    entered the interface's qdisc chain and when the driver took it (M-QDELAY at a sender's own egress)."""

    kind: Literal["queue_trace"] = "queue_trace"
    interface: InterfaceName
    stop_ns: int
    buffer_kib: int = Field(default=16384, ge=1024, le=limits.MAX_TRACE_BUFFER_KIB,
                            description="per-CPU ring buffer of the instance")


class QdiscStatsTask(_TaskBase):
    kind: Literal["qdisc_stats"] = "qdisc_stats"
    interface: InterfaceName
    stop_ns: int
    interval_ms: int = Field(default=10, ge=limits.MIN_SAMPLE_INTERVAL_MS, le=limits.MAX_SAMPLE_INTERVAL_MS)


class SsSampleTask(_TaskBase):
    """Poll `ss -tinH` (argv list, no shell) until stop_ns; the agent filters on the given peers."""

    kind: Literal["ss_sample"] = "ss_sample"
    stop_ns: int
    interval_ms: int = Field(default=100, ge=limits.MIN_POLL_INTERVAL_MS, le=limits.MAX_SAMPLE_INTERVAL_MS,
                             description="polling interval")
    ports: list[int] = Field(min_length=1, max_length=limits.MAX_PORTS_PER_SAMPLER,
                             description="list sockets whose remote (destination) port is one of these")
    dst_addrs: list[IPAddress] = Field(
        default_factory=list, max_length=16, description="... and whose remote address is one of these (any if empty)")


class CpuLoadTask(_TaskBase):
    """Sample the per-CPU lines of /proc/stat until stop_ns (M-CPU, G-CPULOAD). One per kernel instance:
    hosts that share a kernel (netns lab) share its CPUs, so one sampler covers them all."""

    kind: Literal["cpu_load"] = "cpu_load"
    stop_ns: int
    interval_ms: int = Field(default=100, ge=limits.MIN_POLL_INTERVAL_MS, le=limits.MAX_SAMPLE_INTERVAL_MS,
                             description="sampling interval")


class KernelTraceTask(_TaskBase):
    """Kernel-side timing (docs/plans.md#kernel_trace): a private tracefs instance (clock mono) with the asked
    tracepoints and kprobe/kretprobe pairs the agent creates and removes itself; trace_printk lines too."""

    kind: Literal["kernel_trace"] = "kernel_trace"
    stop_ns: int
    trace_printk: bool = Field(default=False, description="collect trace_printk lines")
    tracepoints: list[Annotated[str, Field(pattern=ktrace.TRACEPOINT_PATTERN)]] = Field(
        default_factory=list, max_length=ktrace.MAX_TRACEPOINTS, description="`system:event`")
    filters: dict[Annotated[str, Field(pattern=ktrace.TRACEPOINT_PATTERN)],
                  Annotated[str, Field(pattern=ktrace.FILTER_PATTERN)]] = Field(
        default_factory=dict, max_length=ktrace.MAX_TRACEPOINTS, description="tracepoint -> filter expression")
    kprobes: list[Annotated[str, Field(pattern=ktrace.SYMBOL_PATTERN)]] = Field(
        default_factory=list, max_length=ktrace.MAX_KPROBES, description="symbols timed by a kprobe + kretprobe")
    buffer_kib: int = Field(default=16384, ge=ktrace.MIN_BUFFER_KIB, le=ktrace.MAX_BUFFER_KIB,
                            description="ring buffer per CPU")


class EventTask(_TaskBase):
    """One timed plan event (schemas/events.py), performed at start_ns and recorded with its timestamps."""

    kind: Literal["event"] = "event"
    index: int = Field(ge=0, le=limits.MAX_TASKS_PER_SCHEDULE, description="the event's index in the plan run")
    name: Literal[PLAN_ACTIONS] = Field(description="the plan action it performs")  # type: ignore[valid-type]
    interface: InterfaceName | None = Field(default=None, description="the interface acted on (allow-listed)")
    action: EventAction

    @model_validator(mode="after")
    def _interface_for_interface_actions(self) -> EventTask:
        if self.action.op != "stop_flows" and self.interface is None:
            raise ValueError(f"{self.action.op} acts on an interface: give `interface`")
        return self


class AppWriterTask(_TaskBase):
    """The app-limited writer (agents/appwriter.py): connects to the sink, then writes `write_size` bytes at
    each instant of its schedule from first_ns until end_ns, logging every write."""

    kind: Literal["app_writer"] = "app_writer"
    port: int = Field(ge=1024, le=65535)
    dst_addr: IPAddress = Field(description="the sink's address")
    cc: str = Field(pattern=r"^[a-z0-9_]{1,32}$")
    nodelay: bool = Field(default=False, description="TCP_NODELAY")
    write_size: int = Field(gt=0, le=limits.MAX_APP_WRITE_BYTES, description="bytes per write")
    interval_ns: int = Field(ge=limits.MIN_APP_WRITE_INTERVAL_NS, description="(mean) time between writes")
    dist: Literal["fixed", "exponential"] = Field(default="fixed", description="fixed or exponential gaps")
    seed: int = Field(default=0, ge=0, lt=2**63, description="seed of the exponential gaps")
    connect_ns: int = Field(description="absolute CLOCK_REALTIME to connect at (after the captures started)")
    first_ns: int = Field(description="absolute CLOCK_REALTIME of the first write")
    end_ns: int = Field(description="no write at or after this instant")

    @model_validator(mode="after")
    def _bounded(self) -> AppWriterTask:
        if not self.start_ns <= self.connect_ns <= self.first_ns < self.end_ns:
            raise ValueError("needs start_ns <= connect_ns <= first_ns < end_ns")
        if self.end_ns - self.first_ns > limits.MAX_RUN_SECONDS * 10**9:
            raise ValueError(f"writes for longer than {limits.MAX_RUN_SECONDS} s")
        return self


class AppSinkTask(_TaskBase):
    """The app-limited flow's receiver: accepts one connection on `port`, reads until EOF or stop_ns."""

    kind: Literal["app_sink"] = "app_sink"
    port: int = Field(ge=1024, le=65535)
    stop_ns: int


class BulkFlow(_Msg):
    """One flow of a bulk sender: to the app sink on `dst_addr`:`port`, until end_ns or `bytes`."""

    port: int = Field(ge=1024, le=65535)
    dst_addr: IPAddress = Field(description="the sink's address")
    cc: str = Field(pattern=r"^[a-z0-9_]{1,32}$")
    nodelay: bool = Field(default=False, description="TCP_NODELAY")
    bytes: int | None = Field(default=None, gt=0, description="stop once this many bytes are accepted")
    end_ns: int = Field(description="absolute CLOCK_REALTIME: no send at or after this instant")


class BulkSenderTask(_TaskBase):
    """The `bulk` flows of one host that start at one instant (agents/bulksend.py): one process connects them
    all at connect_ns (before T0), releases them together at first_ns and keeps them backlogged."""

    kind: Literal["bulk_sender"] = "bulk_sender"
    flows: list[BulkFlow] = Field(min_length=1, max_length=limits.MAX_BULK_FLOWS)
    connect_ns: int = Field(description="absolute CLOCK_REALTIME to connect at (after the captures started)")
    first_ns: int = Field(description="absolute CLOCK_REALTIME of the release: every flow's first send()")

    @model_validator(mode="after")
    def _bounded(self) -> BulkSenderTask:
        if not all(self.start_ns <= self.connect_ns <= self.first_ns < f.end_ns for f in self.flows):
            raise ValueError("needs start_ns <= connect_ns <= first_ns < every flow's end_ns")
        if max(f.end_ns for f in self.flows) - self.first_ns > limits.MAX_RUN_SECONDS * 10**9:
            raise ValueError(f"sends for longer than {limits.MAX_RUN_SECONDS} s")
        ports = [f.port for f in self.flows]
        if len(set(ports)) != len(ports):
            raise ValueError("two flows of one sender go to the same port")
        return self


Task = Annotated[
    Iperf3ServerTask | Iperf3ClientTask | CaptureTask | TcpProbeTask | QueueTraceTask | QdiscStatsTask | SsSampleTask
    | CpuLoadTask | KernelTraceTask | EventTask | AppWriterTask | AppSinkTask | BulkSenderTask,
    Field(discriminator="kind"),
]
