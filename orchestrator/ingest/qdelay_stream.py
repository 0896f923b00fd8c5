"""Per-packet queue delay over long runs in bounded memory: qdelay.match in windows, rows spooled to disk.

`pair_stream(ingress_chunks, egress_chunks)` takes both captures' data direction as streams of chunks
in capture (time) order and pairs them window by window: a window of WINDOW ingress packets against
the egress packets buffered so far, which always reach at least `horizon` past the window's last
ingress timestamp. Matched egress packets leave the buffer; unmatched ones leave it once they are
more than REORDER_NS older than the window's last ingress packet (no later ingress packet can pair
with them, t_out >= t_in). So memory holds one window plus (REORDER_NS + horizon) of egress traffic,
whatever the run length. When a run fits in one window (most runs), the result is exactly
qdelay.pair's; across windows the k-th-occurrence rule applies to the packets still unpaired.

horizon = HORIZON_NS + the netem delay on the path: the egress is always read that far past a window's
last ingress packet, so a packet is paired whenever its sojourn (beyond netem) is below 2 s; a copy
that comes even later may miss its ingress packet and that one is counted as dropped.

The QDELAY rows go to an anonymous temporary file as they are made (36 bytes per ingress packet on
disk, not in memory), with the raw delay t_out - t_in - netem in sojourn_ns; the run-minimum d_fwd is
known only at the end, so `Spool` subtracts it while reading the rows back, chunk by chunk, for the
database writer. Measured numbers: docs/ingest.md.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from typing import IO

import numpy as np

from orchestrator.ingest.qdelay import QdelayResult, match, qdelay_rows, resolve_d_fwd
from orchestrator.storage import records

WINDOW = 1 << 18               # ingress packets per window (~5 s at 600 Mbit/s; peak RSS, docs/ingest.md)
HORIZON_NS = 2_000_000_000     # longest sojourn (beyond netem) a packet may have and still be paired
REORDER_NS = 1_000_000_000     # capture timestamps may step back this much between chunks


class Spool:
    """QDELAY rows in a temporary file, read back in chunks with d_fwd subtracted (re-iterable)."""

    dtype = records.QDELAY

    def __init__(self, fh: IO[bytes], rows: int, d_fwd_ns: int, chunk: int = WINDOW) -> None:
        self._fh, self.rows, self.d_fwd_ns, self.chunk = fh, rows, d_fwd_ns, chunk

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Iterator[np.ndarray]:
        self._fh.seek(0)
        left = self.rows
        while left:
            part = np.fromfile(self._fh, dtype=records.QDELAY, count=min(self.chunk, left))
            if part.size == 0:
                raise OSError("qdelay spool ended early")
            left -= part.size
            part["sojourn_ns"] = np.where(part["dropped"] == 0, part["sojourn_ns"] - self.d_fwd_ns, -1)
            yield part

    def array(self) -> np.ndarray:
        """All rows in memory (tests, small runs)."""
        parts = list(self)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=records.QDELAY)

    def close(self) -> None:
        self._fh.close()


def _windows(chunks: Iterable[np.ndarray], size: int) -> Iterator[np.ndarray]:
    buf: list[np.ndarray] = []
    n = 0
    for c in chunks:
        buf.append(c)
        n += c.size
        if n >= size:
            yield np.concatenate(buf)
            buf, n = [], 0
    if n:
        yield np.concatenate(buf)


def pair_stream(ingress: Iterable[np.ndarray], egress: Iterable[np.ndarray], *, d_fwd_ns: int | None = None,
                netem_ns: int = 0, window: int = WINDOW, horizon_ns: int | None = None,
                spool_dir: str | None = None) -> QdelayResult:
    """qdelay.pair over streams of chunks (each with the QKEY fields plus conn_id); rows as a Spool."""
    horizon = (HORIZON_NS if horizon_ns is None else horizon_ns) + int(netem_ns)
    eg_iter = iter(egress)
    eg_parts: list[np.ndarray] = []
    eg_done, eg_last = False, None
    fh = tempfile.TemporaryFile(dir=spool_dir)
    rows = matched = ce = unmatched = 0
    raw_min: int | None = None
    for win in _windows(ingress, window):
        hi = int(win["ts_ns"].max())
        while not eg_done and (eg_last is None or eg_last <= hi + horizon):
            part = next(eg_iter, None)
            if part is None:
                eg_done = True
            elif part.size:
                eg_parts.append(part)
                eg_last = int(part["ts_ns"][-1])
        eg = eg_parts[0] if len(eg_parts) == 1 else np.concatenate(eg_parts) if eg_parts else win[:0]
        i_rows, e_rows = match(win, eg)
        out = qdelay_rows(win, eg, i_rows, e_rows, win["conn_id"], netem_ns)
        if i_rows.size:
            low = int(out["sojourn_ns"][i_rows].min())
            raw_min = low if raw_min is None else min(raw_min, low)
        out.tofile(fh)
        rows, matched, ce = rows + out.size, matched + i_rows.size, ce + int(out["ce"].sum())
        keep = np.ones(eg.size, dtype=bool)
        keep[e_rows] = False
        expired = keep & (eg["ts_ns"] < hi - REORDER_NS)
        unmatched += int(expired.sum())
        eg_parts = [eg[keep & ~expired]]
    for part in (*eg_parts, *eg_iter):    # egress packets no ingress packet claimed
        unmatched += int(part.size)
    fh.flush()
    d_fwd, source = resolve_d_fwd(d_fwd_ns, raw_min)
    return QdelayResult(rows=Spool(fh, rows, d_fwd), matched=matched, dropped=rows - matched, ce=ce,
                        unmatched_egress=unmatched, d_fwd_ns=d_fwd, d_fwd_source=source, netem_ns=int(netem_ns))
