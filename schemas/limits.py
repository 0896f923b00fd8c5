"""Bounds the agent enforces on every operation, in one place: the protocol models use them, and the plan
loader checks a plan against the same numbers, so a plan the agents would refuse is refused before any host
is touched (never after the hosts were configured)."""
from __future__ import annotations

MAX_RUN_SECONDS = 3600            # a flow's duration, a run's length: one hour
MIN_SAMPLE_INTERVAL_MS = 1        # qdisc statistics
MIN_POLL_INTERVAL_MS = 10         # ss and /proc/stat samplers (one `ss` costs ms of a core)
MAX_SAMPLE_INTERVAL_MS = 10_000   # every sampler
MIN_REPORT_INTERVAL_S = 0.1       # iperf3 -i
MAX_REPORT_INTERVAL_S = 60
MAX_UDP_RATE_BIT = 400 * 10**9    # the fastest NIC a testbed of the studies holds, 4x over
MAX_TASKS_PER_SCHEDULE = 512      # 1024 flows x (client) + samplers would not fit a host anyway
MAX_COLLECT_WAIT_S = 600          # how long collect waits for tasks still running, at most
# ports one tcp_probe / ss sampler follows: the tcp_probe filter ("sport == P || dport == P", 34 characters a
# 5-digit port) must fit the kernel's one-page limit (4096 B, 120 ports); the paced-chirping FCT experiment
# sends 100 flows from one host
MAX_PORTS_PER_SAMPLER = 112
# app-limited (thin-stream) writer: writes one flow makes (1 ms for an hour fits), the shortest interval the
# writer's sleep-then-spin can keep, the largest single write
MAX_APP_WRITES = 4_000_000
MIN_APP_WRITE_INTERVAL_NS = 100_000
MAX_APP_WRITE_BYTES = 1 << 20
# bulk sender: the flows one sender process holds (the flows of one host that start at one instant)
MAX_BULK_FLOWS = 1024
# a tracefs instance's per-CPU ring buffer (queue traces): 256 MiB a CPU holds ~10 M events, an hour of a
# 1 Gbit/s egress at 1500 B; more is memory the host's own work needs
MAX_TRACE_BUFFER_KIB = 262_144
