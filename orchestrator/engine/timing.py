"""Orchestration overhead (pure): how long a run waits before and after its flows, sized from what the
engine measured, and the phase timings every run records.

A run's timeline (docs/architecture.md, "Timeline of a run"): the engine sends `schedule` at S and picks
T0 = S + margin; captures, tracers, pollers and iperf3 servers start at T0 - lead; the flows start at
T0 + start_s; once every flow's connections are closed on its sender (the client task ends there) the
engine waits `grace` and stops the passive tasks; their stop_ns (the last flow's end + tail_max) only
bounds them.

- margin = schedule latency + lead. The schedule latency is what the `schedule` op took to be accepted by
  every host: K_RTT x the worst control RTT of the clock exchange, or K_SCHEDULE x the slowest schedule op of
  the recent runs, whichever is longer, never below the testbed's floor.
- lead = K_READY x the longest any passive task took to be ready in the recent runs (the agent reports when
  tcpdump printed its banner, when the server's port listened, when tracing was enabled: `ready_ns`), never
  below the testbed's floor. A loaded TCG guest once took > 0.7 s to start an iperf3 server: the VM lab's
  floors are the old fixed values.
- grace = the path's base RTT (the final ACK still has to cross the capture host), never below the floor.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.storage.timing import PHASES, PhaseClock, RunTiming  # the shapes a run row stores

__all__ = ["PHASES", "PhaseClock", "RunTiming", "Floors", "Margins", "History", "size_margins", "fixed_margins",
           "ready_latencies", "late_ready", "floors_for", "lead_for_processes", "tail_for_processes"]

K_RTT = 4            # schedule op ~ one control RTT + the agent's work; four covers a slow agent loop
K_SCHEDULE = 2       # ... or twice the slowest schedule op recently measured
K_READY = 1.5        # lead: 1.5 x the slowest readiness recently measured
HISTORY = 8          # runs whose measurements size the next one
LEAD_CAP_NS = 5_000_000_000


@dataclass(frozen=True)
class Floors:
    """The least a testbed kind gets, whatever was measured."""
    schedule_ns: int      # the schedule op's latency
    lead_ns: int          # passive tasks before T0
    grace_ns: int         # after the flows' connections closed, before the captures stop
    tail_max_ns: int      # passive tasks' stop_ns after the last flow's scheduled end (the bound)
    first_lead_ns: int    # the lead before anything was measured (a session's first run: cold caches)
    # each process a host starts before T0 (an iperf3 server per flow it receives, a capture) after the first:
    # where a process start is expensive (a UML host: ~0.1 s from the agent) the lead grows with their number
    per_process_ns: int = 0


FLOORS: dict[str, Floors] = {
    # one machine, agents in namespaces: control RTT ~0.1 ms, tcpdump up in ~20-80 ms when loaded
    # (a session's first tcpdump and tracefs instance took ~210 ms on a loaded 2-core machine)
    "netns": Floors(schedule_ns=30_000_000, lead_ns=150_000_000, grace_ns=30_000_000, tail_max_ns=1_500_000_000,
                    first_lead_ns=400_000_000),
    # TCG guests: the fixed values tcplab used before it measured (2 s margin, 1.2 s lead, 1.5 s tail)
    "vm": Floors(schedule_ns=800_000_000, lead_ns=1_200_000_000, grace_ns=500_000_000,
                 tail_max_ns=3_000_000_000, first_lead_ns=1_200_000_000),
    # UML hosts: the machine's clock and native-speed links, but a process costs ~30 ms to start in a guest
    # (tcpdump, iperf3), twice that while the machine is busy
    "uml": Floors(schedule_ns=100_000_000, lead_ns=400_000_000, grace_ns=100_000_000, tail_max_ns=2_000_000_000,
                  first_lead_ns=800_000_000, per_process_ns=150_000_000),
    "testbed": Floors(schedule_ns=200_000_000, lead_ns=300_000_000, grace_ns=100_000_000,
                      tail_max_ns=2_000_000_000, first_lead_ns=600_000_000),
}
# TCPLAB_FIXED_MARGINS=1 (bench/run_overhead.py's reference): the old constants, without early stop
FIXED = Floors(schedule_ns=800_000_000, lead_ns=1_200_000_000, grace_ns=1_500_000_000, tail_max_ns=1_500_000_000,
               first_lead_ns=1_200_000_000)


def floors_for(kind: str) -> Floors:
    return FLOORS.get(kind, FLOORS["testbed"])


@dataclass(frozen=True)
class Margins:
    schedule_ns: int
    lead_ns: int
    grace_ns: int
    tail_max_ns: int
    early_stop: bool = True   # stop the passive tasks once the flows closed (+ grace), not at stop_ns

    @property
    def start_margin_ns(self) -> int:
        """T0 - the moment the schedule op is sent."""
        return self.schedule_ns + self.lead_ns


def size_margins(floors: Floors, rtts_ns: Iterable[int], schedule_ns: Iterable[int], ready_ns: Iterable[int],
                 base_rtt_ns: int = 0) -> Margins:
    """The margins of the next run from the control RTTs just measured, the recent schedule op durations and
    the recent readiness latencies (each: ns, any number, none is fine)."""
    sched = max([floors.schedule_ns, K_RTT * max(rtts_ns, default=0), K_SCHEDULE * max(schedule_ns, default=0)])
    ready = list(ready_ns)
    lead = min(LEAD_CAP_NS, max(floors.lead_ns, int(K_READY * max(ready)))) if ready else floors.first_lead_ns
    grace = max(floors.grace_ns, int(base_rtt_ns))
    return Margins(schedule_ns=int(sched), lead_ns=int(max(lead, floors.lead_ns)), grace_ns=int(grace),
                   tail_max_ns=floors.tail_max_ns)


def lead_for_processes(m: Margins, floors: Floors, processes: int) -> Margins:
    """The lead, at least the floor's plus per_process_ns for each passive process after the first that one
    host starts before T0 (pure): 8 iperf3 servers on one UML host took ~1.1 s to listen."""
    need = floors.lead_ns + floors.per_process_ns * max(0, processes - 1)
    return m if m.lead_ns >= need else Margins(m.schedule_ns, need, m.grace_ns, m.tail_max_ns, m.early_stop)


def tail_for_processes(m: Margins, floors: Floors, processes: int, late_ns: int = 0) -> Margins:
    """The tail bound, at least the floor's plus twice per_process_ns for each flow process one host starts,
    plus `late_ns`, how late a flow may begin and still run its whole duration (pure). An iperf3 client runs
    its duration from its own start, so one that started late ends late: on a UML host the 8th of 8 staggered
    clients started more than 2 s late and was stopped before it wrote its report; a client whose SYNs a RED
    queue dropped connects seconds late. With early stop the bound costs nothing when the flows end in time."""
    need = floors.tail_max_ns + 2 * floors.per_process_ns * processes + late_ns
    return m if m.tail_max_ns >= need else Margins(m.schedule_ns, m.lead_ns, m.grace_ns, need, m.early_stop)


def fixed_margins() -> Margins:
    return Margins(FIXED.schedule_ns, FIXED.lead_ns, FIXED.grace_ns, FIXED.tail_max_ns, early_stop=False)


def ready_latencies(artifacts: Mapping[str, list[dict]], start_ns: int) -> list[int]:
    """How long each passive task took from its start_ns to ready (its artifact's meta `ready_ns`, in the
    agent's clock like start_ns), per artifact that reports it."""
    return [int(a["meta"]["ready_ns"]) - start_ns for infos in artifacts.values() for a in infos
            if isinstance((a.get("meta") or {}).get("ready_ns"), int)]


def late_ready(artifacts: Mapping[str, list[dict]], t0_ns: int) -> list[tuple[str, dict, float]]:
    """(role, artifact, ms after T0) of every passive task that was ready only after T0 (the lead was too
    short for it: a capture may miss the flows' first packets, a server refuse the first connection)."""
    return [(role, a, (int(a["meta"]["ready_ns"]) - t0_ns) / 1e6) for role, infos in artifacts.items()
            for a in infos if isinstance((a.get("meta") or {}).get("ready_ns"), int)
            and int(a["meta"]["ready_ns"]) > t0_ns]


@dataclass
class History:
    """What the engine measured in the recent runs of one session (the imperative shell keeps one)."""
    schedule_ns: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    ready_ns: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
