"""`ss -tinH` samples (the agent's ss_sample artifact) -> records.SS_SAMPLE rows. Pure.

The artifact (agents/samplers.py SsSample) is the literal output of repeated `ss -tinH [filter]` polls,
each preceded by a line `@ <start_ns> <end_ns>`: CLOCK_REALTIME just before the poll was started and
just after it exited. Lines starting with `#` are comments. Each socket is two lines in iproute2
6.x: `STATE RECV-Q SEND-Q LOCAL:PORT PEER:PORT`, then a line that starts with whitespace and holds
the TCP info (`-i`) as space-separated `name:value` items and a few `name value` pairs, in the order
of iproute2 misc/ss.c tcp_show_info(). `-n` makes every rate an integer in bit/s (`…bps`).

Units and conventions of the rows:
- ts_ns: the middle of the poll's [start, end] (ss reads every socket within it; the span is
  typically 5-8 ms including the fork/exec, see docs/ingest.md);
- rtt_us, rttvar_us, minrtt_us, bbr_mrtt_us: ss prints milliseconds with %g (6 significant digits)
  of the kernel's µs values; they are converted back to integer µs;
- ss omits most fields when they are 0 (retrans, unacked, lost, bytes_*, delivered_ce, …): absent
  means 0. Where absence means "not known" instead, the row holds -1 (NaN for floats) and the
  database holds NULL: ssthresh (ss omits the initial "infinite" ssthresh), pacing_rate_bit and
  delivery_rate_bit (not yet measured), and the DCTCP and BBR fields of sockets using another
  congestion control (or DCTCP in fallback mode, i.e. without ECN);
- dctcp_alpha is stored as a fraction 0..1: the kernel reports dctcp_alpha scaled by
  DCTCP_MAX_ALPHA = 1024 (net/ipv4/tcp_dctcp.c), and ss prints that integer; alpha = value / 1024.
- busy_ms, rwnd_limited_ms, sndbuf_limited_ms: the socket's TCP_INFO chrono times so far (ss prints
  `busy:Nms`, then `rwnd_limited:Nms(P%)` and `sndbuf_limited:Nms(P%)` only when non-zero): absent = 0;
- retrans is the `retrans:a/b` pair's a (segments retransmitted and not yet acknowledged),
  retrans_total its b (retransmissions over the socket's life).
Addresses are normalised as in tcp_probe.py: IPv4-mapped IPv6 -> dotted IPv4, `%scope` dropped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from orchestrator.ingest.tcp_probe import _normalise
from orchestrator.storage import records

DCTCP_MAX_ALPHA = 1024

_POLL = re.compile(r"^@ (\d+) (\d+)\s*$")
_SOCKET = re.compile(r"^(\S+)\s+\d+\s+\d+\s+(\S+)\s+(\S+)\s*$")
# what ss prints without inet_diag: `ESTAB 0 0 a:p b:p rto:0.36 ato:0.04 qack:15 bidir cwnd:10 ...`
_PROC_FALLBACK = re.compile(r"^\S+\s+\d+\s+\d+\s+\S+\s+\S+\s+[a-z_]+:")
_ENDPOINT = re.compile(r"^(?:\[([^\]]+)\]|([^\s\[\]]+)):(\d+|\*)$")
_ITEM = re.compile(r"([a-z_]+):(\S+)")
_RATE = re.compile(r"\b(send|pacing_rate|delivery_rate) (\d+(?:\.\d+)?)bps")
_DCTCP = re.compile(r"\bdctcp:\(ce_state:(\d+),alpha:(\d+),ab_ecn:(\d+),ab_tot:(\d+)\)")
_BBR = re.compile(r"\bbbr:\(bw:(\d+(?:\.\d+)?)bps,mrtt:([0-9.e+-]+)(?:,pacing_gain:([0-9.e+-]+))?"
                  r"(?:,cwnd_gain:([0-9.e+-]+))?\)")
_RATE_ANY = re.compile(r"\b(?:send|pacing_rate|delivery_rate) (\S+)")
_CC = re.compile(r"^\s*(?:(?:ts|sack|ecn|ecnseen|fastopen)\s+)*([a-z][a-z0-9_]*)\s")

# name:value items copied as integers (absent -> 0)
_COUNTERS = ("cwnd", "mss", "bytes_sent", "bytes_retrans", "bytes_acked", "unacked", "lost", "delivered",
             "delivered_ce")


class SsFormatError(ValueError):
    """A line of the artifact the parser does not understand; says which."""

    def __init__(self, line_no: int, line: str, why: str) -> None:
        super().__init__(f"ss sample line {line_no}: {why}: {line.strip()[:200]}")
        self.line_no, self.line, self.why = line_no, line, why


@dataclass(frozen=True)
class SsStats:
    polls: int           # `@` lines
    empty_polls: int     # polls that listed no socket
    max_span_ns: int     # longest poll (end - start): the timestamp uncertainty is half of it


def parse_ss(text: str) -> np.ndarray:
    """records.SS_SAMPLE rows, one per socket per poll, in artifact order."""
    return parse_ss_with_stats(text)[0]


def parse_ss_with_stats(text: str) -> tuple[np.ndarray, SsStats]:
    rows: list[tuple] = []
    polls = empty = span = 0
    ts: int | None = None
    pending: tuple[int, str, str] | None = None   # socket line waiting for its info line
    listed = 0
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("@"):
            m = _POLL.match(line)
            if m is None:
                raise SsFormatError(no, line, "bad poll line (expected `@ <start_ns> <end_ns>`)")
            if pending is not None:
                raise SsFormatError(pending[0], pending[1], "socket line without its info line")
            if polls and not listed:
                empty += 1
            a, b = int(m.group(1)), int(m.group(2))
            ts, polls, listed, span = (a + b) // 2, polls + 1, 0, max(span, b - a)
            continue
        if ts is None:
            raise SsFormatError(no, line, "output before the first `@` poll line")
        if line[0] in " \t":
            if pending is None:
                raise SsFormatError(no, line, "info line without a socket line")
            rows.append(_row(ts, pending, no, line))
            pending, listed = None, listed + 1
            continue
        if pending is not None:
            raise SsFormatError(pending[0], pending[1], "socket line without its info line")
        m = _SOCKET.match(line)
        if m is None and _PROC_FALLBACK.match(line):
            raise SsFormatError(no, line, "socket and timer fields on one line: ss read /proc/net/tcp, not "
                                "inet_diag (the host's kernel has no tcp_diag loaded), so it has no TCP_INFO")
        if m is None:
            raise SsFormatError(no, line, "not a socket line")
        pending = (no, m.group(2), m.group(3))
    if pending is not None:
        raise SsFormatError(pending[0], pending[1], "socket line without its info line")
    if polls and not listed:
        empty += 1
    out = np.zeros(len(rows), dtype=records.SS_SAMPLE)
    if rows:
        cols = list(zip(*rows, strict=True))
        for name, col in zip(records.SS_SAMPLE.names, cols, strict=True):
            out[name] = col
    return out, SsStats(polls=polls, empty_polls=empty, max_span_ns=span)


def _endpoint(no: int, line: str, text: str) -> tuple[str, int]:
    m = _ENDPOINT.match(text)
    if m is None or m.group(3) == "*":
        raise SsFormatError(no, line, f"bad endpoint {text!r}")
    host = (m.group(1) or m.group(2)).split("%", 1)[0]
    return _normalise(host), int(m.group(3))


def _ms_to_us(value: str) -> int:
    return round(float(value) * 1000)


def _row(ts: int, sock: tuple[int, str, str], no: int, info: str) -> tuple:
    """One SS_SAMPLE row as a tuple in dtype field order."""
    sno, local, peer = sock
    saddr, sport = _endpoint(sno, local, local)
    daddr, dport = _endpoint(sno, peer, peer)
    cc = _CC.match(info)
    items = dict(_ITEM.findall(info))
    rates = dict(_RATE.findall(info))
    rtt, rttvar = items.get("rtt", "-0.001/-0.001").split("/")
    retrans = items.get("retrans", "0/0").split("/")
    for value in _RATE_ANY.findall(info):
        if not re.match(r"\d+(?:\.\d+)?bps", value):
            raise SsFormatError(no, info, f"rate {value!r} is not in bit/s (was ss run without -n?)")
    dctcp = _DCTCP.search(info)
    bbr = _BBR.search(info)
    nan = float("nan")
    counters = [int(items.get(k, 0)) for k in _COUNTERS]
    return (
        ts, saddr, sport, daddr, dport, cc.group(1) if cc else "",
        *counters,
        int(items.get("ssthresh", -1)),
        _ms_to_us(rtt), _ms_to_us(rttvar), _ms_to_us(items.get("minrtt", "-0.001")),
        round(float(rates.get("delivery_rate", -1))), round(float(rates.get("pacing_rate", -1))),
        int(retrans[0]), int(retrans[1]) if len(retrans) > 1 else 0,
        int(dctcp.group(2)) / DCTCP_MAX_ALPHA if dctcp else nan,
        int(dctcp.group(3)) if dctcp else -1, int(dctcp.group(4)) if dctcp else -1,
        round(float(bbr.group(1))) if bbr else -1,
        _ms_to_us(bbr.group(2)) if bbr else -1,
        float(bbr.group(3)) if bbr and bbr.group(3) else nan,
        float(bbr.group(4)) if bbr and bbr.group(4) else nan,
        *(_chrono_ms(no, info, items.get(k, "0ms")) for k in ("busy", "rwnd_limited", "sndbuf_limited")),
    )


def _chrono_ms(no: int, info: str, value: str) -> int:
    """`busy:1172ms`, `rwnd_limited:40ms(3.4%)` -> ms (ss prints the kernel's µs / 1000)."""
    m = re.match(r"(\d+)ms(?:\(|$)", value)
    if m is None:
        raise SsFormatError(no, info, f"chrono time {value!r} is not '<n>ms' or '<n>ms(<p>%)'")
    return int(m.group(1))
