"""Column layouts (numpy dtypes) of parsed artifacts: what parsers emit and DB writers load.

Arrays, not per-row objects, cross the parser -> writer boundary so that millions of packets never
become Python objects. Field names equal the DB column names in orchestrator/storage/tables.py.
"""
from __future__ import annotations

import numpy as np

PACKET = np.dtype([
    ("ts_ns", "i8"),
    ("src_addr", "U45"), ("dst_addr", "U45"),
    ("src_port", "i4"), ("dst_port", "i4"),
    ("seq", "i8"), ("ack", "i8"),
    ("payload_len", "i4"), ("ip_len", "i4"),
    ("tcp_flags", "i2"), ("ecn", "i2"),
    ("ip_id", "i4"),
    ("tsval", "i8"), ("tsecr", "i8"),   # -1 when the packet carries no timestamp option
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
