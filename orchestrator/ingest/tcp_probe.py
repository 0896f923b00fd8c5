"""tracefs `tcp:tcp_probe` text -> records.TCP_PROBE array.

Owns the parsing of a tracefs instance's `trace` file (the format of kernels 5.x-6.x:
`TASK-PID [CPU] FLAGS TIMESTAMP: tcp_probe: family=… src=… dest=… mark=… data_len=… snd_nxt=0x…
snd_una=0x… snd_cwnd=… ssthresh=… snd_wnd=… srtt=… rcv_wnd=… sock_cookie=<hex> [skbaddr=… skaddr=…]`).
Timestamps are in the instance's trace clock; the caller passes the offset that maps that clock to
the run's common time base (ns): ts_ns = round(trace_seconds × 1e9) + clock_offset_ns, computed in
integers from the printed digits so no float rounding creeps in.

Addresses are printed by the kernel with %pISpc: IPv4 `a.b.c.d:port`, IPv6 `[addr]:port`. A dual-stack
(AF_INET6) socket talking IPv4 prints `[::ffff:a.b.c.d]`; those map to the dotted IPv4 so that probe
rows and packet rows name the same endpoints.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.ingest.tracetext import hex_column, trace_ns
from orchestrator.storage import records

_ADDR = r"(?:\[([0-9a-fA-F:.]+)\]|(\d+\.\d+\.\d+\.\d+)):(\d+)"
_EVENT = re.compile(
    r"(\d+)\.(\d+): tcp_probe: family=\S+ "
    rf"src={_ADDR} dest={_ADDR} mark=\S+ data_len=(\d+) "
    r"snd_nxt=(?:0x)?([0-9a-fA-F]+) snd_una=(?:0x)?([0-9a-fA-F]+) "
    r"snd_cwnd=(\d+) ssthresh=(\d+) snd_wnd=(\d+) srtt=(\d+) rcv_wnd=(\d+) "
    r"sock_cookie=(?:0x)?([0-9a-fA-F]+)"
)
_MARKER = ": tcp_probe: "
_ENTRIES = re.compile(r"^# entries-in-buffer/entries-written: (\d+)/(\d+)", re.MULTILINE)


class TcpProbeFormatError(ValueError):
    """A tcp_probe line the parser does not understand (kernel format change?); says which line."""

    def __init__(self, line_no: int, line: str) -> None:
        super().__init__(f"tcp_probe trace line {line_no}: cannot parse: {line.strip()[:200]}")
        self.line_no, self.line = line_no, line


@dataclass(frozen=True)
class TcpProbeStats:
    """Completeness of a trace: lost and overwritten events mean gaps in the cwnd/srtt series."""

    events: int
    entries_in_buffer: int | None  # from the `# entries-in-buffer/entries-written` header, if present
    entries_written: int | None    # written > in buffer: the ring buffer wrapped, oldest events gone

    @property
    def overwritten(self) -> int:
        """Events lost because the ring buffer wrapped before `trace` was read (0 if unknown)."""
        if self.entries_in_buffer is None or self.entries_written is None:
            return 0
        return self.entries_written - self.entries_in_buffer


def parse_tcp_probe(text: str, clock_offset_ns: int) -> np.ndarray:
    """records.TCP_PROBE rows, in trace order, for every tcp_probe event in a tracefs `trace` text."""
    return parse_tcp_probe_with_stats(text, clock_offset_ns)[0]


def parse_tcp_probe_with_stats(text: str, clock_offset_ns: int) -> tuple[np.ndarray, TcpProbeStats]:
    """Like parse_tcp_probe, plus the trace header's counts (did the ring buffer wrap?)."""
    cols = _columns(text)
    if cols is None:   # some event line is not in the known format: name it
        _raise_first_unparsed(text)
    n = len(cols["sport"])
    if n != text.count(_MARKER):
        _raise_first_unparsed(text)
    out = np.zeros(n, dtype=records.TCP_PROBE)
    if n:
        out["ts_ns"] = cols["ts_ns"] + clock_offset_ns
        for name in ("saddr", "daddr", "sport", "dport", "data_len", "snd_cwnd", "ssthresh", "snd_wnd",
                     "srtt_us", "rcv_wnd", "snd_nxt", "snd_una"):
            out[name] = cols[name]
        # The cookie is a u64 counter printed in hex; keep its bits in the signed column.
        out["sock_cookie"] = cols["sock_cookie"].view(np.int64)
    entries = _ENTRIES.search(text)
    stats = TcpProbeStats(
        events=n,
        entries_in_buffer=int(entries.group(1)) if entries else None,
        entries_written=int(entries.group(2)) if entries else None,
    )
    return out, stats


# The event's fields after `tcp_probe: `, in the kernel's order (later kernels may append skbaddr=/skaddr=).
_FIELDS = ("family", "src", "dest", "mark", "data_len", "snd_nxt", "snd_una", "snd_cwnd", "ssthresh", "snd_wnd",
           "srtt", "rcv_wnd", "sock_cookie")
_DECIMAL = {"data_len": "data_len", "snd_cwnd": "snd_cwnd", "ssthresh": "ssthresh", "snd_wnd": "snd_wnd",
            "srtt": "srtt_us", "rcv_wnd": "rcv_wnd"}
def _columns(text: str) -> dict[str, np.ndarray] | None:
    """Every event's fields as numpy columns named as in records.TCP_PROBE (ts_ns in the trace clock), in one
    pass of Arrow's string kernels (a 5 s run's trace is ~35k events, 10 MB: the regex over Python strings took
    0.6 s of the run's ingest). None when a line does not have the known layout (a field missing, out of order,
    or not a number): the caller then names that line."""
    lines = pc.split_pattern(pa.array([text]), "\n").flatten()
    events = pc.filter(lines, pc.match_substring(lines, _MARKER))
    if len(events) == 0:
        return {k: np.zeros(0, dtype=np.int64) for k in ("sport", "ts_ns")}
    halves = pc.split_pattern(events, _MARKER, max_splits=1)
    stamp = pc.list_element(pc.split_pattern(pc.list_element(halves, 0), " ", max_splits=1, reverse=True), 1)
    sec_frac = pc.split_pattern(stamp, ".", max_splits=1)
    tokens = pc.split_pattern(pc.list_element(halves, 1), " ")
    too_short = pc.min(pc.list_value_length(tokens)).as_py() < len(_FIELDS)
    if too_short or pc.min(pc.list_value_length(sec_frac)).as_py() != 2:
        return None
    offsets = tokens.offsets.to_numpy()
    flat, first = tokens.flatten(), offsets[:-1] - offsets[0]
    raw = {}
    for i, key in enumerate(_FIELDS):
        col = flat.take(pa.array(first + i))
        if not pc.all(pc.starts_with(col, key + "=")).as_py():
            return None
        raw[key] = pc.utf8_slice_codeunits(col, len(key) + 1)
    try:
        cols = {out: pc.cast(raw[key], pa.int64()).to_numpy() for key, out in _DECIMAL.items()}
        if any((col < 0).any() for col in cols.values()):   # the kernel prints these unsigned
            return None
        cols["ts_ns"] = trace_ns(pc.cast(pc.list_element(sec_frac, 0), pa.int64()).to_numpy(),
                                  pc.list_element(sec_frac, 1))
        for side, key in (("s", "src"), ("d", "dest")):
            addr_port = pc.split_pattern(raw[key], ":", max_splits=1, reverse=True)
            cols[side + "port"] = pc.cast(pc.list_element(addr_port, 1), pa.int64()).to_numpy()
            cols[side + "addr"] = _addresses(pc.utf8_trim(pc.list_element(addr_port, 0), "[]"))
    except (pa.ArrowInvalid, ValueError):
        return None
    for key in ("snd_nxt", "snd_una", "sock_cookie"):
        value = hex_column(pc.replace_substring_regex(raw[key], "^0x", ""))
        if value is None:
            return None
        cols[key] = value if key == "sock_cookie" else value.astype(np.int64)
    return cols


def _addresses(col: pa.Array) -> np.ndarray:
    """One string per event; each distinct address normalised once (IPv4-mapped -> dotted IPv4)."""
    coded = pc.dictionary_encode(col)
    names = np.array([_normalise(str(u)) for u in coded.dictionary.to_pylist()], dtype="U45")
    return names[coded.indices.to_numpy()]


def _normalise(addr: str) -> str:
    if ":" not in addr:
        return addr
    packed = socket.inet_pton(socket.AF_INET6, addr)
    if packed[:12] == b"\x00" * 10 + b"\xff\xff":
        return socket.inet_ntoa(packed[12:])
    return socket.inet_ntop(socket.AF_INET6, packed)


def _raise_first_unparsed(text: str) -> None:
    for no, line in enumerate(text.splitlines(), start=1):
        if _MARKER in line and not _EVENT.search(line):
            raise TcpProbeFormatError(no, line)
    raise TcpProbeFormatError(0, "(event count mismatch)")
