"""Numbers in tracefs text, as Arrow string columns become numpy arrays without a Python object per value: the
`SEC.FRACTION` stamps of time trace clocks, and hexadecimal fields (pointers, cookies). Shared by the parsers
of tcp_probe and queue traces."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_HEX_DIGITS = np.full(256, 255, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16)
_HEX_DIGITS[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def trace_ns(sec: np.ndarray, frac: pa.Array) -> np.ndarray:
    """Trace timestamps in integer ns: seconds and fraction digits combined exactly.

    Time clocks (local, global, mono, mono_raw, boot, tai) print `sec.µs`; counter clocks (counter,
    x86-tsc) print bare integers that are not seconds: they have no fraction, and the parsers refuse them.
    """
    whole = sec * 1_000_000_000
    widths = pc.utf8_length(frac).to_numpy()
    digits = pc.cast(frac, pa.int64()).to_numpy()
    if widths.min() == widths.max() and widths[0] <= 9:  # the usual case: one width for the whole file
        return whole + digits * 10 ** (9 - int(widths[0]))
    return whole + np.array([int(f) * 10 ** (9 - len(f)) if len(f) <= 9 else round(int(f) / 10 ** (len(f) - 9))
                             for f in frac.to_pylist()], dtype=np.int64)


def hex_column(col: pa.Array) -> np.ndarray | None:
    """Unsigned hex strings (at most 16 digits) as uint64, without a Python int per value; None if one is not."""
    if len(col) and pc.max(pc.utf8_length(col)).as_py() > 16:
        return None
    padded = pc.utf8_lpad(col, 16, "0")
    start = int(np.frombuffer(padded.buffers()[1], np.int32)[padded.offset])   # every value is 16 bytes now
    nibbles = _HEX_DIGITS[np.frombuffer(padded.buffers()[2], np.uint8)[start: start + 16 * len(col)]]
    if (nibbles == 255).any():
        return None
    return (nibbles.reshape(-1, 16).astype(np.uint64) << (np.arange(60, -4, -4, dtype=np.uint64))).sum(
        axis=1, dtype=np.uint64)
