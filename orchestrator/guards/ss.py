"""Guards on the `ss -ti` samples of a run's data sockets (G-CC and G-SOCKBUF after the run)."""
from __future__ import annotations

import numpy as np

from orchestrator.plan import RunSpec
from schemas.flag import Flag


def _data_sockets(spec: RunSpec, host: str, ss: np.ndarray, sender_ports: dict[int, int | None]):
    """Per TCP flow sent from `host`: (flow, data socket's port, its ss rows). iperf3's control connection to
    the same port runs the host's default CC (seen: bbr next to a `-C cubic` stream), so the data socket is
    the flow's recorded sender port, else the one that sent the most bytes."""
    for f in (f for f in spec.flows if f.src == host and f.tool != "udp"):
        mine = ss[ss["dport"] == f.port]
        if mine.size:
            sport = sender_ports.get(f.flow_id) or int(mine["sport"][np.argmax(mine["bytes_sent"])])
            yield f, sport, mine[mine["sport"] == sport]


def ss_cc_findings(spec: RunSpec, host: str, ss: np.ndarray, sender_ports: dict[int, int | None]) -> list[Flag]:
    """G-CC post: the congestion control `ss -ti` names on each flow's data socket is the plan's."""
    out = []
    for f, sport, rows in _data_sockets(spec, host, ss, sender_ports):
        seen = sorted({str(c) for c in rows["cc"]} - {""})
        if seen and seen != [f.cc]:
            out.append(Flag(guard="G-CC", host=host,
                            message=f"flow {f.flow_id} (port {sport} -> {f.port}) ran {', '.join(seen)} "
                               f"per ss, the plan says {f.cc}"))
    return out


SOCKBUF_LIMITED_SHARE = 0.01   # G-SOCKBUF post: limited by a socket buffer for > 1 % of the busy time


def ss_sockbuf_findings(spec: RunSpec, host: str, ss: np.ndarray,
                        sender_ports: dict[int, int | None]) -> list[Flag]:
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
                out.append(Flag(guard="G-SOCKBUF", host=host,
                                message=f"flow {f.flow_id} (port {sport} -> {f.port}) was limited by "
                                   f"{what} for {share:.0%} of its busy time ({int(last[field])} of "
                                   f"{int(last['busy_ms'])} ms): the socket, not the network; raise {knob}"))
    return out
