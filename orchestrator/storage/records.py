"""Column layouts (numpy dtypes) of parsed artifacts: what parsers emit and DB writers load.

Arrays, not per-row objects, cross the parser -> writer boundary so that millions of packets never
become Python objects. Field names equal DB column names in orchestrator/storage/tables.py, except
for PACKET's endpoint fields (proto, ipv, addresses, ports, point), which the writer moves into the
per-run `conn` table (one row per direction of a 5-tuple at a capture point; see docs/ingest.md).
"""
from __future__ import annotations

import numpy as np

# 100 bytes per packet. Addresses are raw bytes, IPv4 in the first 4 of the 16 (rest zero), IPv6 all
# 16; `ipv` says which. orchestrator/storage/addr.py formats them (once per distinct address).
PACKET = np.dtype([
    ("ts_ns", "i8"),
    ("src_addr", "V16"), ("dst_addr", "V16"),
    ("seq", "i8"), ("ack", "i8"),          # TCP, unsigned 32-bit values; 0 for UDP
    ("tsval", "i8"), ("tsecr", "i8"),      # TCP timestamp option; -1 when absent (and for UDP)
    ("src_port", "i4"), ("dst_port", "i4"),
    ("payload_len", "i4"), ("ip_len", "i4"),
    ("ip_id", "i4"),                       # IPv4 identification; 0 for IPv6
    ("tcp_flags", "i2"),                   # NS CWR ECE URG ACK PSH RST SYN FIN; 0 for UDP
    ("ecn", "i2"),                         # IP ECN codepoint: 0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE
    ("point", "i2"),                       # capture point id within the run (reader argument)
    ("proto", "u1"),                       # 6 TCP, 17 UDP
    ("ipv", "u1"),                         # 4 or 6
])

PROTO_TCP, PROTO_UDP = 6, 17

# Columns of the `packet` table taken from a PACKET array (the writer adds run_key and conn_id).
PACKET_VALUE_FIELDS = ("ts_ns", "seq", "ack", "payload_len", "ip_len", "tcp_flags", "ecn", "ip_id",
                       "tsval", "tsecr")
# What identifies a conn: one direction of a 5-tuple at one capture point.
CONN_FIELDS = ("point", "proto", "ipv", "src_addr", "dst_addr", "src_port", "dst_port")

# Per-packet queue delay from paired captures (orchestrator/ingest/qdelay.py), one row per packet
# seen at the aqm ingress. ts_out_ns and sojourn_ns are meaningful only where dropped == 0.
QDELAY = np.dtype([
    ("conn_id", "i4"),                     # the ingress conn (see CONN_FIELDS)
    ("ts_in_ns", "i8"), ("ts_out_ns", "i8"),
    ("sojourn_ns", "i8"),                  # t_out - t_in - d_fwd - netem delay on the path
    ("payload_len", "i4"),
    ("ce", "i2"),                          # 1: CE at egress, not CE at ingress (marked by the AQM)
    ("dropped", "i2"),                     # 1: never seen at egress
])

TCP_PROBE = np.dtype([
    ("ts_ns", "i8"),
    ("saddr", "U45"), ("sport", "i4"), ("daddr", "U45"), ("dport", "i4"),
    ("snd_cwnd", "i8"), ("ssthresh", "i8"), ("srtt_us", "i8"),
    ("snd_wnd", "i8"), ("rcv_wnd", "i8"),
    ("snd_nxt", "i8"), ("snd_una", "i8"), ("data_len", "i4"),
    ("sock_cookie", "i8"),
])

QDISC_SAMPLE = np.dtype([
    ("ts_ns", "i8"),
    ("handle", "U16"), ("parent", "U16"), ("kind", "U16"),
    ("bytes", "i8"), ("packets", "i8"), ("drops", "i8"), ("overlimits", "i8"), ("requeues", "i8"),
    ("backlog_bytes", "i8"), ("qlen", "i8"),
])

IPERF_INTERVAL = np.dtype([
    ("stream_port", "i4"),          # local (sender) port of the data stream
    ("start_s", "f8"), ("end_s", "f8"),
    ("bytes", "i8"), ("bits_per_second", "f8"),
    ("retransmits", "i8"), ("snd_cwnd", "i8"), ("rtt_us", "i8"),
])

# `ss -tinH` samples (orchestrator/ingest/ss.py), one row per socket per poll. Units: rtt in µs,
# rates in bit/s, dctcp_alpha as a fraction 0..1 (the kernel's value / DCTCP_MAX_ALPHA = 1024).
# SS_NULLABLE fields hold -1 (NaN for floats) where ss did not report them; the DB stores NULL.
SS_SAMPLE = np.dtype([
    ("ts_ns", "i8"),
    ("saddr", "U45"), ("sport", "i4"), ("daddr", "U45"), ("dport", "i4"),
    ("cc", "U16"),
    ("cwnd", "i8"), ("mss", "i8"),
    ("bytes_sent", "i8"), ("bytes_retrans", "i8"), ("bytes_acked", "i8"),
    ("unacked", "i8"), ("lost", "i8"), ("delivered", "i8"), ("delivered_ce", "i8"),
    ("ssthresh", "i8"),
    ("rtt_us", "i8"), ("rttvar_us", "i8"), ("minrtt_us", "i8"),
    ("delivery_rate_bit", "i8"), ("pacing_rate_bit", "i8"),
    ("retrans", "i8"), ("retrans_total", "i8"),
    ("dctcp_alpha", "f8"), ("dctcp_ab_ecn", "i8"), ("dctcp_ab_tot", "i8"),
    ("bbr_bw_bit", "i8"), ("bbr_mrtt_us", "i8"), ("bbr_pacing_gain", "f8"), ("bbr_cwnd_gain", "f8"),
    ("busy_ms", "i8"), ("rwnd_limited_ms", "i8"), ("sndbuf_limited_ms", "i8"),   # TCP_INFO chrono, 0 if absent
])
SS_NULLABLE = ("ssthresh", "rtt_us", "rttvar_us", "minrtt_us", "delivery_rate_bit", "pacing_rate_bit",
               "dctcp_alpha", "dctcp_ab_ecn", "dctcp_ab_tot", "bbr_bw_bit", "bbr_mrtt_us", "bbr_pacing_gain",
               "bbr_cwnd_gain")


def null_masks(arr: np.ndarray, fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Boolean NULL masks of nullable fields: -1 in integer fields, NaN in float fields."""
    out = {}
    for name in fields:
        col = arr[name]
        out[name] = np.isnan(col) if col.dtype.kind == "f" else col < 0
    return out


# Kernel-side timing (orchestrator/ingest/ktrace.py), one row per event: a tracepoint hit, a trace_printk line,
# or a kprobe/kretprobe pair of one call (event = the symbol, duration_ns = return - entry). duration_ns -1 and
# value NaN where the row has none (stored NULL); text: the line's message (tracepoint fields, trace_printk text).
KERNEL_TRACE = np.dtype([
    ("ts_ns", "i8"),                       # CLOCK_REALTIME (the entry, for a pair)
    ("cpu", "i4"), ("pid", "i4"),
    ("source", "U10"),                     # kprobe | tracepoint | printk
    ("event", "U64"),                      # symbol, `system:event` or the trace_printk caller / its name
    ("duration_ns", "i8"),
    ("value", "f8"),                       # the number of a `name ... <n> ns`-like trace_printk line
    ("text", "U160"),
])
KERNEL_TRACE_NULLABLE = ("duration_ns", "value")

# One application write of an app-limited flow (orchestrator/ingest/applat.py), from the writer's log joined
# with the receiver-side capture and the sink's log. Clocks: sched_ns, t_ns the writer's host; arrive_ns the
# receiver-side capture's host; read_ns the sink's host; the latencies are in the manager's clock (each
# host's clock offset removed). arrive_ns, read_ns and the latencies hold -1 where there is none (NULL).
APP_WRITE = np.dtype([
    ("write_index", "i4"),
    ("sched_ns", "i8"), ("t_ns", "i8"),    # the scheduled instant; CLOCK_REALTIME just before send()
    ("stream_offset", "i8"), ("len", "i4"),   # stream offset of the write's first byte; bytes asked
    ("accepted", "i4"),                    # bytes the socket took; -1 send failed, -2 instant skipped (late)
    ("arrive_ns", "i8"),                   # first arrival of the write's first byte at the receiver side
    ("arrivals", "i4"),                    # captured packets that carried that byte (> 1: it came again;
                                           # -1: made before the capture started and not seen)
    ("read_ns", "i8"),                     # the sink's read that returned the write's last byte
    ("latency_ns", "i8"),                  # M-APPLAT: arrive − t
    ("read_latency_ns", "i8"),             # M-APPREAD: read − t
])
APP_WRITE_NULLABLE = ("arrive_ns", "read_ns", "latency_ns", "read_latency_ns")
