"""`iperf3 -J` output (client or server side, iperf3 3.x) -> Iperf3Result.

Owns the mapping from iperf3's JSON to typed values: which streams carried data (addresses and
ports), whether this side sent, which congestion controls were reported, the per-interval per-stream
rows as a records.IPERF_INTERVAL array, the end summary, and iperf3's own error string.

Conventions:
- `stream_port` in interval rows is the port of the *sending* end of the stream, so client and
  server JSON of one test produce the same key, and it matches the packet and tcp_probe rows.
- Values iperf3 does not know on this side are -1 in the array and None in the dataclasses, also
  where iperf3 3.12 prints 0 for them: cwnd/RTT on the receiving side (not exchanged between the
  ends), and on a server the byte count of the other direction (a server never learns the client's
  results; a client does: it receives the server's byte and retransmit counts).
- Intervals flagged `omitted` (iperf3 -O warm-up) are dropped, as iperf3 drops them from its sums;
  how many is kept in `omitted_intervals`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.storage import records
from schemas.iperf3_output import split_leading_warnings


class Iperf3FormatError(ValueError):
    """The text is not iperf3 JSON output."""


@dataclass(frozen=True)
class Iperf3Stream:
    """One data stream as seen from this side, with its end-of-test summary."""

    socket: int
    local_host: str
    local_port: int
    remote_host: str
    remote_port: int
    sender_port: int                 # port of the sending end (local_port if this side sent)
    bytes_sent: int | None           # end.streams[].sender.bytes
    bytes_received: int | None       # end.streams[].receiver.bytes
    retransmits: int | None          # only the sending side's kernel knows
    max_snd_cwnd_bytes: int | None
    min_rtt_us: int | None
    mean_rtt_us: int | None
    max_rtt_us: int | None


@dataclass(frozen=True)
class Iperf3Result:
    """Everything tcplab keeps from one iperf3 JSON document."""

    version: str | None
    role: str | None                 # "client" / "server"; None when iperf3 failed before saying
    protocol: str | None             # "TCP" / "UDP" (absent when the test never started)
    sender: bool | None              # this side sent the data (None: test never started)
    reverse: bool | None             # -R: the server sent
    streams: tuple[Iperf3Stream, ...]
    sender_cc: str | None            # end.sender_tcp_congestion, if reported on this side
    receiver_cc: str | None          # end.receiver_tcp_congestion
    start_unix_s: int | None         # start.timestamp.timesecs
    intervals: np.ndarray            # records.IPERF_INTERVAL, interval-major, streams in JSON order
    omitted_intervals: int
    bytes_sent: int | None           # end.sum_sent.bytes
    bytes_received: int | None       # end.sum_received.bytes
    retransmits: int | None          # end.sum_sent.retransmits, when this side knows them
    error: str | None                # iperf3's "error" string, verbatim
    warnings: tuple[str, ...] = ()   # lines iperf3 printed before the document (schemas/iperf3_output.py)

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_iperf3(json_text: str) -> Iperf3Result:
    """Parse one iperf3 -J document (a client's or a one-off server's), after any warning lines iperf3 printed
    before it."""
    warnings, json_text = split_leading_warnings(json_text)
    try:
        doc = json.loads(json_text)
    except json.JSONDecodeError as e:
        raise Iperf3FormatError(f"not JSON (line {e.lineno} column {e.colno}): {e.msg}") from e
    if not isinstance(doc, dict) or "start" not in doc:
        raise Iperf3FormatError("not iperf3 -J output: no 'start' object")
    start: dict[str, Any] = doc["start"]
    end: dict[str, Any] = doc.get("end") or {}
    test_start: dict[str, Any] = start.get("test_start") or {}
    role = "client" if "connecting_to" in start else "server" if "accepted_connection" in start else None
    reverse = bool(test_start["reverse"]) if "reverse" in test_start else None
    sender = _sender(doc, role, reverse)
    end_by_socket = {s["sender"]["socket"]: s for s in end.get("streams", []) if "sender" in s}
    known = _Known(sender=bool(sender), server=role == "server")
    streams = tuple(_stream(c, known, end_by_socket.get(c["socket"])) for c in start.get("connected", []))
    intervals, omitted = _intervals(doc.get("intervals", []), {s.socket: s.sender_port for s in streams})
    sum_sent: dict[str, Any] = end.get("sum_sent") or {}
    sum_received: dict[str, Any] = end.get("sum_received") or {}
    return Iperf3Result(
        version=start.get("version"),
        role=role,
        protocol=test_start.get("protocol"),
        sender=sender,
        reverse=reverse,
        streams=streams,
        sender_cc=end.get("sender_tcp_congestion"),
        receiver_cc=end.get("receiver_tcp_congestion"),
        start_unix_s=(start.get("timestamp") or {}).get("timesecs"),
        intervals=intervals,
        omitted_intervals=omitted,
        bytes_sent=_int(sum_sent.get("bytes")) if known.sent_bytes else None,
        bytes_received=_int(sum_received.get("bytes")) if known.received_bytes else None,
        retransmits=_int(sum_sent.get("retransmits")),
        error=doc.get("error"),
        warnings=warnings,
    )


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _sender(doc: dict[str, Any], role: str, reverse: bool | None) -> bool | None:
    """Whether this side sent: iperf3 says so per summary and interval; else derive from role and -R."""
    end = doc.get("end") or {}
    for summary in ("sum_sent", "sum"):
        if "sender" in (end.get(summary) or {}):
            return bool(end[summary]["sender"])
    for interval in doc.get("intervals", []):
        for s in interval.get("streams", []):
            return bool(s["sender"])
    if reverse is None:
        return None
    return (role == "client") != reverse


@dataclass(frozen=True)
class _Known:
    """Which end-summary numbers this side of the test actually knows (see the module docstring)."""

    sender: bool
    server: bool

    @property
    def sent_bytes(self) -> bool:
        return self.sender or not self.server

    @property
    def received_bytes(self) -> bool:
        return not (self.sender and self.server)


def _stream(conn: dict[str, Any], known: _Known, summary: dict[str, Any] | None) -> Iperf3Stream:
    snd: dict[str, Any] = (summary or {}).get("sender") or {}
    rcv: dict[str, Any] = (summary or {}).get("receiver") or {}
    local = snd if known.sender else {}  # cwnd/RTT: only the sending kernel has them
    return Iperf3Stream(
        socket=int(conn["socket"]),
        local_host=conn["local_host"],
        local_port=int(conn["local_port"]),
        remote_host=conn["remote_host"],
        remote_port=int(conn["remote_port"]),
        sender_port=int(conn["local_port"] if known.sender else conn["remote_port"]),
        bytes_sent=_int(snd.get("bytes")) if known.sent_bytes else None,
        bytes_received=_int(rcv.get("bytes")) if known.received_bytes else None,
        retransmits=_int(snd.get("retransmits")),
        max_snd_cwnd_bytes=_int(local.get("max_snd_cwnd")),
        min_rtt_us=_int(local.get("min_rtt")),
        mean_rtt_us=_int(local.get("mean_rtt")),
        max_rtt_us=_int(local.get("max_rtt")),
    )


def _intervals(intervals: list[dict[str, Any]], port_of: dict[int, int]) -> tuple[np.ndarray, int]:
    rows: list[tuple[int, float, float, int, float, int, int, int]] = []
    omitted = 0
    for interval in intervals:
        streams = interval.get("streams", [])
        if any(s.get("omitted") for s in streams):
            omitted += 1
            continue
        for s in streams:
            rows.append((
                port_of.get(int(s["socket"]), -1),
                float(s["start"]), float(s["end"]), int(s["bytes"]), float(s["bits_per_second"]),
                int(s.get("retransmits", -1)), int(s.get("snd_cwnd", -1)), int(s.get("rtt", -1)),
            ))
    return np.array(rows, dtype=records.IPERF_INTERVAL), omitted
