"""Guards before a run: pure checks of a RunSpec against the pitfalls a plan can walk into (docs/guards.md).

A finding refuses the run unless the plan lists its guard in `accept_guards` (an experiment may study the
pitfall itself, e.g. an undersized netem limit); an accepted finding is recorded as a flag of the run.
"""
from __future__ import annotations

from orchestrator.plan import RunSpec
from schemas.flag import Flag
from schemas.hoststate import Htb, Netem, QdiscStage
from schemas.qdiscs import kind_of

HTB_BURST_TIME_NS = 10**6              # G-HTB: at least rate x 1 ms of burst
COUNTING_OFFLOADS = ("tso", "gso", "gro")
DEFAULT_TCP_LIMIT_OUTPUT_BYTES = 1_048_576   # Linux >= 4.19 (older kernels: 262144)


def _mtu(spec: RunSpec) -> int:
    return (spec.derived.wire_frame_bytes or 1514) - 14


def _buffer_packets(stages: list[QdiscStage], mtu: int) -> int:
    """Packets the stages below a netem can hold (kernels differ on whether netem's limit counts them); each
    kind says what it holds (schemas/qdiscs/), a packet-limited one its limit or tc's default."""
    return sum(kind_of(s).buffer_packets(s, mtu) for s in stages)


def netem_findings(spec: RunSpec) -> list[Flag]:
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
                    out.append(Flag(guard="G-NETEM", host=role, message=f"netem on the interface toward {toward} holds "
                                       f"{s.limit_packets} packets; {s.delay_ns / 1e6:g} ms at {rate / 1e6:g} "
                                       f"Mbit/s plus its child's buffer needs >= {need}: it would drop silently"))
    return out


def htb_findings(spec: RunSpec) -> list[Flag]:
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
                        out.append(Flag(guard="G-HTB", host=role, message=f"htb toward {toward}: {name} "
                                           f"{got if got is not None else 'unset (tc default ~1 MTU)'} B is "
                                           f"below rate x 1 ms = {need} B; the shaper cannot reach "
                                           f"{s.rate_bit / 1e6:g} Mbit/s"))
    return out


def offload_findings(spec: RunSpec) -> list[Flag]:
    """G-OFFLOAD: a queue that counts packets sees 64 KB super-packets unless TSO/GSO/GRO are off."""
    if not any(hp.qdiscs for hp in spec.hosts.values()):
        return []
    out = []
    for role, hp in spec.hosts.items():
        on = [o for o in COUNTING_OFFLOADS if hp.offloads.get(o) is not False]
        if on:
            out.append(Flag(guard="G-OFFLOAD", host=role,
                            message=f"{', '.join(on)} not switched off while the run's queues "
                               "count packets; set them off (or accept G-OFFLOAD when TSO is the variable)"))
    return out


def _max_field(value: str | None) -> int | None:
    try:
        return int(value.split()[-1]) if value else None
    except ValueError:
        return None


def sockbuf_findings(spec: RunSpec) -> list[Flag]:
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
                out.append(Flag(guard="G-SOCKBUF", host=role,
                                message=f"{name} max {got} B < 2 x (BDP + buffer) = {need} B: "
                                   "the socket, not the network, would limit the flow"))
    return sorted(set(out), key=str)


def tsq_findings(spec: RunSpec) -> list[Flag]:
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
            out.append(Flag(guard="G-TSQ", host=role,
                            message=f"each flow keeps ~{share} B in the sender's own qdiscs, at or above "
                               f"tcp_limit_output_bytes = {limit}; raise it"))
    return out


def pre_run_findings(spec: RunSpec) -> list[Flag]:
    return (netem_findings(spec) + htb_findings(spec) + offload_findings(spec) + sockbuf_findings(spec)
            + tsq_findings(spec))


def refusing(spec: RunSpec) -> list[Flag]:
    """Findings the plan did not accept: they refuse the run."""
    return [f for f in pre_run_findings(spec) if f.guard not in spec.accept_guards]


def accepted(spec: RunSpec) -> list[Flag]:
    """Findings the plan accepted: the run goes ahead and carries them as flags."""
    return [f.model_copy(update={"accepted": True}) for f in pre_run_findings(spec) if f.guard in spec.accept_guards]
