"""Pitfall guards (EXPERIMENTS.md §8) as named, pure checks over a resolved run.

Each guard returns `Finding`s that name the guard, the host and what to change. Before a run
(`pre_run_findings`) a finding refuses the run unless the plan lists the guard in `accept_guards` (an
experiment may study the pitfall itself, e.g. an undersized netem limit); accepted findings are recorded
as run flags. `clock_findings` runs after the clock exchange and flags cross-host metrics; `cpuload_findings`
runs on the CPU samples the hosts took during the run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.ingest.cpu import CpuIntervals
from orchestrator.plan import RunSpec
from schemas.hoststate import Bfifo, Htb, Netem, Pfifo, QdiscStage, Red

HTB_BURST_TIME_NS = 10**6              # G-HTB: at least rate x 1 ms of burst
COUNTING_OFFLOADS = ("tso", "gso", "gro")
DEFAULT_TCP_LIMIT_OUTPUT_BYTES = 1_048_576   # Linux >= 4.19 (older kernels: 262144)
CLOCK_THRESHOLD_NS = 1_000_000


@dataclass(frozen=True)
class Finding:
    guard: str
    host: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.guard}{f' host {self.host}' if self.host else ''}: {self.message}"


def _mtu(spec: RunSpec) -> int:
    return (spec.derived.wire_frame_bytes or 1514) - 14


def _buffer_packets(stages: list[QdiscStage], mtu: int) -> int:
    """Packets the stages below a netem can hold (kernels differ on whether netem's limit counts them)."""
    total = 0
    for s in stages:
        if isinstance(s, Pfifo):
            total += s.limit_packets
        elif isinstance(s, Bfifo):
            total += -(-s.limit_bytes // mtu)
        elif isinstance(s, Red):
            total += -(-s.limit_bytes // mtu)
        elif getattr(s, "limit_packets", None) and not isinstance(s, Netem):
            total += s.limit_packets
    return total


def netem_findings(spec: RunSpec) -> list[Finding]:
    """G-NETEM: limit >= ceil(1.5 x rate x delay / MTU) + the child's buffer, at the highest rate netem sees."""
    out = []
    mtu = _mtu(spec)
    line = spec.derived.line_rate_bit
    for role, hp in spec.hosts.items():
        for toward, chain in hp.qdiscs.items():
            for i, s in enumerate(chain):
                if not isinstance(s, Netem) or s.delay_ns == 0:
                    continue
                shaped = [x.rate_bit for x in chain[i + 1:] if isinstance(x, Htb)]
                rate = line or (shaped[0] if shaped else spec.derived.bottleneck_rate_bit)
                if rate is None:
                    continue
                need = -(-3 * rate * s.delay_ns // (2 * 8 * 10**9 * mtu)) + _buffer_packets(chain[i + 1:], mtu)
                if s.limit_packets < need:
                    out.append(Finding("G-NETEM", role, f"netem on the interface toward {toward} holds "
                                       f"{s.limit_packets} packets; {s.delay_ns / 1e6:g} ms at {rate / 1e6:g} "
                                       f"Mbit/s plus its child's buffer needs >= {need}: it would drop silently"))
    return out


def htb_findings(spec: RunSpec) -> list[Finding]:
    """G-HTB: an explicit burst of at least rate x 1 ms / 8 (tc's own default is about one MTU)."""
    out = []
    for role, hp in spec.hosts.items():
        for toward, chain in hp.qdiscs.items():
            for s in chain:
                if not isinstance(s, Htb):
                    continue
                need = -(-s.rate_bit * HTB_BURST_TIME_NS // (8 * 10**9))
                for name, got in (("burst", s.burst_bytes), ("cburst", s.cburst_bytes or s.burst_bytes)):
                    if got is None or got < need:
                        out.append(Finding("G-HTB", role, f"htb toward {toward}: {name} "
                                           f"{got if got is not None else 'unset (tc default ~1 MTU)'} B is "
                                           f"below rate x 1 ms = {need} B; the shaper cannot reach "
                                           f"{s.rate_bit / 1e6:g} Mbit/s"))
    return out


def offload_findings(spec: RunSpec) -> list[Finding]:
    """G-OFFLOAD: a queue that counts packets sees 64 KB super-packets unless TSO/GSO/GRO are off."""
    if not any(hp.qdiscs for hp in spec.hosts.values()):
        return []
    out = []
    for role, hp in spec.hosts.items():
        on = [o for o in COUNTING_OFFLOADS if hp.offloads.get(o) is not False]
        if on:
            out.append(Finding("G-OFFLOAD", role, f"{', '.join(on)} not switched off while the run's queues "
                               "count packets; set them off (or accept G-OFFLOAD when TSO is the variable)"))
    return out


def _max_field(value: str | None) -> int | None:
    try:
        return int(value.split()[-1]) if value else None
    except ValueError:
        return None


def sockbuf_findings(spec: RunSpec) -> list[Finding]:
    """G-SOCKBUF: tcp_wmem[2] (senders) and tcp_rmem[2] (receivers) >= 2 x (BDP + buffer). With a marking
    AQM the queue the flows can build is its upper threshold, not the hard limit behind it."""
    bdp, marking = spec.derived.bdp_bytes, spec.derived.marking_queue_bytes
    buf = marking if marking is not None else spec.derived.queue_capacity_bytes or 0
    if bdp is None:
        return []
    need = 2 * (bdp + buf)
    out = []
    for f in spec.flows:
        for role, name in ((f.src, "net.ipv4.tcp_wmem"), (f.dst, "net.ipv4.tcp_rmem")):
            got = _max_field(spec.hosts[role].sysctls.get(name)) if role in spec.hosts else None
            if got is not None and got < need:
                out.append(Finding("G-SOCKBUF", role, f"{name} max {got} B < 2 x (BDP + buffer) = {need} B: "
                                   "the socket, not the network, would limit the flow"))
    return sorted(set(out), key=str)


def tsq_findings(spec: RunSpec) -> list[Finding]:
    """G-TSQ: with the bottleneck chain on the sender itself, TCP Small Queues must allow a flow's share of
    (delay + target) x rate to sit in local qdiscs."""
    out = []
    senders = {f.src for f in spec.flows}
    rate, target_us = spec.derived.bottleneck_rate_bit, spec.derived.target_us or 0
    for role in senders:
        hp = spec.hosts.get(role)
        if hp is None or rate is None:
            continue
        delay = max((s.delay_ns for c in hp.qdiscs.values() for s in c if isinstance(s, Netem)), default=None)
        if delay is None:
            continue
        n = max(1, sum(1 for f in spec.flows if f.src == role))
        share = int((delay + target_us * 1000) * rate / 8e9 / n)
        limit = int(hp.sysctls.get("net.ipv4.tcp_limit_output_bytes", DEFAULT_TCP_LIMIT_OUTPUT_BYTES))
        if share >= limit:
            out.append(Finding("G-TSQ", role, f"each flow keeps ~{share} B in the sender's own qdiscs, at or above "
                               f"tcp_limit_output_bytes = {limit}; raise it"))
    return out


def pre_run_findings(spec: RunSpec) -> list[Finding]:
    return (netem_findings(spec) + htb_findings(spec) + offload_findings(spec) + sockbuf_findings(spec)
            + tsq_findings(spec))


def refusing(spec: RunSpec) -> list[Finding]:
    """Findings the plan did not accept: they refuse the run."""
    return [f for f in pre_run_findings(spec) if f.guard not in spec.accept_guards]


def clock_findings(offsets_ns: dict[str, int], threshold_ns: int = CLOCK_THRESHOLD_NS) -> list[Finding]:
    """G-CLOCK: a host whose clock is off by more than the threshold invalidates cross-host metrics."""
    return [Finding("G-CLOCK", host, f"clock offset {off / 1e3:.0f} us exceeds {threshold_ns / 1e3:.0f} us: "
                    "cross-host metrics of this run are invalid")
            for host, off in sorted(offsets_ns.items()) if abs(off) > threshold_ns]


CPULOAD_BUSY = 0.90        # G-CPULOAD: a core counts as saturated above 90 % busy (softirq and steal included)
CPULOAD_WINDOW_SHARE = 0.05   # ... and the run is flagged when that holds for more than 5 % of the window


def cpu_summary(load: CpuIntervals, window: tuple[int, int]) -> dict[str, dict[str, float]]:
    """M-CPU over the measurement window, per CPU: time-weighted mean busy, softirq and steal shares, the
    busiest interval, and the share of the window spent above CPULOAD_BUSY. Intervals without a tick are left
    out (their share of time is unknown)."""
    weight = load.overlap_ns(window).astype(np.float64)
    out = {}
    for i, cpu in enumerate(load.cpus):
        busy = load.busy[:, i]
        w = np.where(np.isnan(busy), 0.0, weight)
        if w.sum() == 0:
            continue
        out[cpu] = {"busy_mean": float(np.average(np.nan_to_num(busy), weights=w)),
                    "busy_max": float(np.nanmax(np.where(w > 0, busy, np.nan))),
                    "softirq_mean": float(np.average(np.nan_to_num(load.softirq[:, i]), weights=w)),
                    "steal_mean": float(np.average(np.nan_to_num(load.steal[:, i]), weights=w)),
                    "saturated_share": float(w[np.nan_to_num(busy) > CPULOAD_BUSY].sum() / w.sum())}
    return out


def cpuload_findings(summary: dict[str, dict[str, float]], host: str) -> list[Finding]:
    """G-CPULOAD: any core of a run's host > 90 % busy (incl. softirq) for > 5 % of the window. `host` names
    every role that shares that kernel (a netns lab is one machine)."""
    if not summary:
        return [Finding("G-CPULOAD", host, "no CPU sample covers the measurement window: the host's load "
                        "during the run is unknown")]
    hot = {cpu: s for cpu, s in summary.items() if s["saturated_share"] > CPULOAD_WINDOW_SHARE}
    return [Finding("G-CPULOAD", host, f"{cpu} was > {CPULOAD_BUSY:.0%} busy for {s['saturated_share']:.0%} of "
                    f"the measurement window (mean {s['busy_mean']:.0%}, softirq {s['softirq_mean']:.0%}, "
                    f"steal {s['steal_mean']:.0%}): the lab host, not the network, may have limited this run")
            for cpu, s in hot.items()]


# ---------------------------------------------------------------- after the run, on what was measured

SHAPERS = ("htb", "tbf")
DATA_SHARE_OF_RATE = 0.10   # an htb that carried less than this share of R x window carried ACKs, not data


def _counter_deltas(samples: np.ndarray) -> dict[str, dict[str, int | str]]:
    """handle -> kind, parent and the drops/overlimits/bytes its counters advanced by over the samples."""
    out: dict[str, dict[str, int | str]] = {}
    for handle in dict.fromkeys(samples["handle"].tolist()):
        mine = samples[samples["handle"] == handle]
        first, last = mine[0], mine[-1]
        out[handle] = {"kind": str(last["kind"]), "parent": str(last["parent"]),
                       **{c: int(last[c]) - int(first[c]) for c in ("drops", "overlimits", "bytes")}}
    return out


def _own_drops(handle: str, deltas: dict[str, dict[str, int | str]]) -> int:
    """A qdisc's drop counter includes what its child qdiscs dropped (htb and netem count a refused child
    enqueue as their own drop), so its own drops are the difference."""
    major = handle.split(":")[0]
    children = [d for d in deltas.values() if str(d["parent"]).split(":")[0] == major and d["parent"] != "root"]
    return int(deltas[handle]["drops"]) - sum(int(c["drops"]) for c in children)


def qdisc_findings(spec: RunSpec, host: str, iface: str, samples: np.ndarray) -> list[Finding]:
    """On one sampled interface: drops anywhere but in the chain's last qdisc (M-DROP: netem -> G-NETEM,
    a shaper -> G-HTB, unless the plan asked netem for loss), and a bottleneck htb that carried data
    without ever throttling (G-HTB post: the shaper was not the bottleneck)."""
    if samples.size < 2:
        return []
    deltas = _counter_deltas(samples)
    window_s = max(1e-9, (int(samples["ts_ns"].max()) - int(samples["ts_ns"].min())) / 1e9)
    parents = {str(d["parent"]).split(":")[0] for d in deltas.values()}
    hp = spec.hosts.get(host)
    planned_loss = any(isinstance(s, Netem) and s.loss > 0 for c in (hp.qdiscs.values() if hp else ()) for s in c)
    out = []
    for handle, d in deltas.items():
        leaf = handle.split(":")[0] not in parents
        own = _own_drops(handle, deltas)
        if not leaf and own > 0 and not (d["kind"] == "netem" and planned_loss):
            guard = "G-NETEM" if d["kind"] == "netem" else "G-HTB" if d["kind"] in SHAPERS else "M-DROP"
            out.append(Finding(guard, host, f"{d['kind']} {handle} on {iface} dropped {own} packets itself, above "
                               "the queue under test: drops outside the AQM (raise its limit)"))
    rate = spec.derived.bottleneck_rate_bit
    bulk = any(f.tool == "iperf3" and not f.bytes for f in spec.flows)
    for handle, d in deltas.items():
        carried_bit = int(d["bytes"]) * 8
        if (d["kind"] == "htb" and bulk and rate and carried_bit >= DATA_SHARE_OF_RATE * rate * window_s
                and int(d["overlimits"]) == 0):
            out.append(Finding("G-HTB", host, f"htb {handle} on {iface} carried {carried_bit / window_s / 1e6:.1f} "
                               "Mbit/s of bulk traffic but never throttled (overlimits 0): the shaper was not "
                               "the bottleneck"))
    return out


def _data_sockets(spec: RunSpec, host: str, ss: np.ndarray, sender_ports: dict[int, int | None]):
    """Per TCP flow sent from `host`: (flow, data socket's port, its ss rows). iperf3's control connection to
    the same port runs the host's default CC (seen: bbr next to a `-C cubic` stream), so the data socket is
    the flow's recorded sender port, else the one that sent the most bytes."""
    for f in (f for f in spec.flows if f.src == host and f.tool != "udp"):
        mine = ss[ss["dport"] == f.port]
        if mine.size:
            sport = sender_ports.get(f.flow_id) or int(mine["sport"][np.argmax(mine["bytes_sent"])])
            yield f, sport, mine[mine["sport"] == sport]


def ss_cc_findings(spec: RunSpec, host: str, ss: np.ndarray, sender_ports: dict[int, int | None]) -> list[Finding]:
    """G-CC post: the congestion control `ss -ti` names on each flow's data socket is the plan's."""
    out = []
    for f, sport, rows in _data_sockets(spec, host, ss, sender_ports):
        seen = sorted({str(c) for c in rows["cc"]} - {""})
        if seen and seen != [f.cc]:
            out.append(Finding("G-CC", host, f"flow {f.flow_id} (port {sport} -> {f.port}) ran {', '.join(seen)} "
                               f"per ss, the plan says {f.cc}"))
    return out


SOCKBUF_LIMITED_SHARE = 0.01   # G-SOCKBUF post: limited by a socket buffer for > 1 % of the busy time


def ss_sockbuf_findings(spec: RunSpec, host: str, ss: np.ndarray,
                        sender_ports: dict[int, int | None]) -> list[Finding]:
    """G-SOCKBUF post: TCP_INFO's chrono times on each flow's data socket (its last sample: they accumulate)
    say how long the send buffer or the peer's receive window, not the network, held the flow back."""
    out = []
    for f, sport, rows in _data_sockets(spec, host, ss, sender_ports):
        last = rows[np.argmax(rows["busy_ms"])] if rows.size else None
        if last is None or last["busy_ms"] <= 0:
            continue
        for field, what, knob in (("sndbuf_limited_ms", "its send buffer", f"tcp_wmem on {f.src}"),
                                  ("rwnd_limited_ms", "the receiver's window", f"tcp_rmem on {f.dst}")):
            share = int(last[field]) / int(last["busy_ms"])
            if share > SOCKBUF_LIMITED_SHARE:
                out.append(Finding("G-SOCKBUF", host, f"flow {f.flow_id} (port {sport} -> {f.port}) was limited by "
                                   f"{what} for {share:.0%} of its busy time ({int(last[field])} of "
                                   f"{int(last['busy_ms'])} ms): the socket, not the network; raise {knob}"))
    return out


ECN_SETTING_CCS = frozenset({"dctcp", "prague"})   # CCs that request ECN themselves (tcp_ca_needs_ecn)
ECT_SHARE_MIN = 0.5   # Linux sends retransmissions not-ECT (RFC 3168 §6.1.5): a negotiated flow stays far above


def ecn_expected(spec: RunSpec, flow) -> bool:
    """The flow's sender asks for ECN: tcp_ecn = 1 on it, or a CC that sets ECN itself."""
    hp = spec.hosts.get(flow.src)
    return flow.cc in ECN_SETTING_CCS or (hp is not None and str(hp.sysctls.get("net.ipv4.tcp_ecn", "")).strip() == "1")


def ecn_findings(spec: RunSpec, flow_rows: list[dict], counts: list[dict]) -> list[Finding]:
    """G-ECN post, per flow that should use ECN, from the packets the capture points saw: the SYN carries
    ECE+CWR, the SYN-ACK ECE, and the data is ECN-capable (ECT or CE). A handshake no point captured is not
    judged; a SYN retried without ECE (tcp_ecn_fallback) is the failure this exists for."""
    ports = {r["flow_id"]: r.get("src_port") for r in flow_rows}
    out = []
    for f in spec.flows:
        if f.tool == "udp" or not ecn_expected(spec, f):
            continue
        to_dst = [c for c in counts if c["dst_port"] == f.port]
        if not to_dst:
            continue
        sport = ports.get(f.flow_id) or max(to_dst, key=lambda c: c["data"])["src_port"]
        fwd = [c for c in to_dst if c["src_port"] == sport]
        rev = [c for c in counts if c["src_port"] == f.port and c["dst_port"] == sport]
        problems = []
        if sum(c["syn"] for c in fwd) and not sum(c["syn_ecn"] for c in fwd):
            problems.append("its SYN carried no ECE+CWR")
        if sum(c["synack"] for c in rev) and not sum(c["synack_ece"] for c in rev):
            problems.append("the SYN-ACK carried no ECE")
        best = max(fwd, key=lambda c: c["data"], default=None)
        if best and best["data"] and best["data_ect"] / best["data"] < ECT_SHARE_MIN:
            problems.append(f"{best['data_ect'] / best['data']:.0%} of its data packets at {best['point']} were "
                            "ECN-capable")
        if problems:
            out.append(Finding("G-ECN", f.src, f"flow {f.flow_id} ({sport} -> {f.port}) did not use ECN: "
                               + "; ".join(problems) + " (check tcp_ecn on both ends and tcp_ecn_fallback=0)"))
    return out
