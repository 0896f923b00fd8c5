"""What a run's captures show of each flow's two ends (used by bench/run_overhead.py and the lab tests): at
every capture point, the data connection's first SYN and its end, and the close of the iperf3 control
connection -- proof from the packets that the capture began before the flow and ended after it was over.
Read from the database (packet and conn tables) after the run is stored.

An iperf3 data connection ends with a reset, not FINs: at the end of the test the receiving iperf3 closes its
socket with data still arriving, so its kernel sends RST (and answers every segment still in flight through
the bottleneck with another RST). What iperf3 does last is the control connection's close, after the results
exchange: both FINs and the last ACK (the one after the later FIN, from the other side). A data connection
that does close with FINs counts with the same rule."""
from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import Engine

from orchestrator.storage import tables as T

SYN, FIN, RST, ACK = 0x02, 0x01, 0x04, 0x10


@dataclass(frozen=True)
class FlowEnds:
    run_id: str
    flow_id: int
    point: str
    syn: bool             # the data connection's SYN from the sender (no ACK)
    data_end: str         # "fin" (both FINs and the last ACK), "rst" (a reset), "" (neither seen)
    control_closed: bool  # the control connection's FINs and last ACK (True where the flow has none)

    @property
    def complete(self) -> bool:
        return self.syn and bool(self.data_end) and self.control_closed


Packets = list[tuple[int, int]]   # (ts_ns, tcp_flags) of one direction


def closed(a: Packets, b: Packets) -> bool:
    """Both FINs and, after the later one, an ACK from the other side (pure)."""
    fin_a, fin_b = [t for t, f in a if f & FIN], [t for t, f in b if f & FIN]
    if not fin_a or not fin_b:
        return False
    later, other = (max(fin_a), b) if max(fin_a) > max(fin_b) else (max(fin_b), a)
    return any(t > later and f & ACK for t, f in other)


def ends_of(sender: Packets, receiver: Packets) -> tuple[bool, str]:
    """(syn, data_end) of a data connection from each direction's packets (pure)."""
    syn = any(f & SYN and not f & ACK for _, f in sender)
    end = "fin" if closed(sender, receiver) else "rst" if any(f & RST for _, f in sender + receiver) else ""
    return syn, end


def flow_ends(db: Engine, run_id: str) -> list[FlowEnds]:
    """FlowEnds of every flow of the run at every capture point that saw it."""
    out = []
    with db.connect() as conn:
        key = conn.execute(sa.select(T.run.c.run_key).where(T.run.c.run_id == run_id)).scalar_one()
        flows = conn.execute(sa.select(T.flow.c.flow_id, T.flow.c.src_port, T.flow.c.dst_port)
                             .where(T.flow.c.run_id == run_id)).all()
        for f in flows:
            c, p = T.conn, T.packet
            rows = conn.execute(   # every connection to or from the flow's port: data and control
                sa.select(c.c.point, c.c.src_port, c.c.dst_port, p.c.ts_ns, p.c.tcp_flags)
                .join(p, sa.and_(p.c.run_key == c.c.run_key, p.c.conn_id == c.c.conn_id))
                .where(c.c.run_key == key, c.c.proto == 6,
                       sa.or_(c.c.dst_port == f.dst_port, c.c.src_port == f.dst_port),
                       sa.or_(p.c.tcp_flags.op("&")(SYN | FIN | RST) != 0, p.c.payload_len == 0))).all()
            for point in sorted({r.point for r in rows}):
                here = [r for r in rows if r.point == point]

                def side(src: int, dst: int, rows=here) -> Packets:
                    return [(r.ts_ns, r.tcp_flags) for r in rows if r.src_port == src and r.dst_port == dst]

                peers = {r.src_port for r in here if r.dst_port == f.dst_port} - {f.src_port}
                control = all(closed(side(q, f.dst_port), side(f.dst_port, q)) for q in peers)
                out.append(FlowEnds(run_id, f.flow_id, point,
                                    *ends_of(side(f.src_port, f.dst_port), side(f.dst_port, f.src_port)),
                                    control_closed=control and bool(peers)))
    return out
