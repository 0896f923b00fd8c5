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
    rows = _EVENT.findall(text)
    if len(rows) != text.count(_MARKER):
        _raise_first_unparsed(text)
    out = np.zeros(len(rows), dtype=records.TCP_PROBE)
    if rows:
        (sec, frac, s6, s4, sport, d6, d4, dport, data_len, snd_nxt, snd_una, cwnd, ssthresh,
         snd_wnd, srtt, rcv_wnd, cookie) = zip(*rows, strict=True)
        out["ts_ns"] = _trace_ns(sec, frac) + clock_offset_ns
        out["saddr"] = _addresses(s6, s4)
        out["daddr"] = _addresses(d6, d4)
        for name, col in (("sport", sport), ("dport", dport), ("data_len", data_len),
                          ("snd_cwnd", cwnd), ("ssthresh", ssthresh), ("snd_wnd", snd_wnd),
                          ("srtt_us", srtt), ("rcv_wnd", rcv_wnd)):
            out[name] = np.array(col).astype(np.int64)
        out["snd_nxt"] = _hex(snd_nxt)
        out["snd_una"] = _hex(snd_una)
        # The cookie is a u64 counter printed in hex; keep its bits in the signed column.
        out["sock_cookie"] = np.array([int(c, 16) for c in cookie], dtype=np.uint64).view(np.int64)
    entries = _ENTRIES.search(text)
    stats = TcpProbeStats(
        events=len(rows),
        entries_in_buffer=int(entries.group(1)) if entries else None,
        entries_written=int(entries.group(2)) if entries else None,
    )
    return out, stats


def _trace_ns(sec: tuple[str, ...], frac: tuple[str, ...]) -> np.ndarray:
    """Trace timestamps in integer ns: seconds and fraction digits combined exactly.

    Time clocks (local, global, mono, mono_raw, boot, tai) print `sec.µs`; counter clocks (counter,
    x86-tsc) print bare integers that are not seconds, so the event regex does not accept them.
    """
    whole = np.array(sec).astype(np.int64) * 1_000_000_000
    widths = {len(f) for f in frac}
    if len(widths) == 1 and (w := widths.pop()) <= 9:  # the usual case: one width for the whole file
        return whole + np.array(frac).astype(np.int64) * 10 ** (9 - w)
    return whole + np.array([int(f) * 10 ** (9 - len(f)) if len(f) <= 9 else round(int(f) / 10 ** (len(f) - 9))
                             for f in frac], dtype=np.int64)


def _hex(col: tuple[str, ...]) -> np.ndarray:
    return np.array([int(v, 16) for v in col], dtype=np.int64)


def _addresses(v6: tuple[str, ...], v4: tuple[str, ...]) -> np.ndarray:
    """One string per event; each distinct address normalised once (IPv4-mapped -> dotted IPv4)."""
    raw = np.array([a or b for a, b in zip(v6, v4, strict=True)])
    uniq, inv = np.unique(raw, return_inverse=True)
    names = np.array([_normalise(str(u)) for u in uniq], dtype="U45")
    return names[inv.reshape(-1)]


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
