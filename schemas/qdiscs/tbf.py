"""tbf: token bucket filter (a shaper with one inner class, so a stage may hang below it)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import (
    Expect,
    QdiscKind,
    Strict,
    bits,
    bytes_in_packets,
    parse_tc_size,
    tc_rounded,
    tc_size,
    whole_us,
)


class Tbf(Strict):
    kind: Literal["tbf"] = "tbf"
    rate_bit: int = Field(gt=0)
    burst_bytes: int = Field(gt=0)
    limit_bytes: int = Field(gt=0)


def _burst(text: str) -> int:
    """tbf's burst as `tc -d -j` prints it: "5000b/1" (size / cell size)."""
    return parse_tc_size(text.split("/")[0])


def _burst_equal(rate: int):
    """tc sends the burst in bytes (the kernel keeps it exactly) but prints it back from the kernel's
    64 ns ticks, truncated to whole µs: the printed burst is up to ~1 µs at the rate short, on top of the
    1024-rounding (10 Gbit/s: 5000 B prints as 3750b)."""
    return lambda got, want: tc_size(got, want) or (isinstance(got, int) and want - 1.1e-6 * rate - 16 <= got <= want)


def expected(s: Tbf) -> list[Expect]:
    rate = s.rate_bit // 8
    out = [Expect("rate", ("options", "rate"), rate, ("rate_bit",), tc_rounded, unit="B/s"),
           Expect("burst", ("options", "burst"), s.burst_bytes, ("burst_bytes",), _burst_equal(rate), read=_burst,
                  unit="bytes")]
    # tc prints no limit: it prints `lat`, the time a full queue waits beyond the burst, (limit - burst) / rate
    # in whole µs, and the limit itself only when that time would be negative
    if s.limit_bytes >= s.burst_bytes:
        lat = (s.limit_bytes - s.burst_bytes) * 10**6 / rate
        out.append(Expect("lat", ("options", "lat"), lat, ("limit_bytes",), whole_us, unit="us",
                          why=f"limit {s.limit_bytes} B = burst + lat x rate"))
    else:
        out.append(Expect("limit", ("options", "limit"), s.limit_bytes, ("limit_bytes",), unit="bytes"))
    return out


TBF = QdiscKind(
    stage=Tbf,
    params=lambda s: ["tbf", "rate", bits(s.rate_bit), "burst", str(s.burst_bytes), "limit", str(s.limit_bytes)],
    expected=expected,
    buffer_packets=lambda s, mtu: bytes_in_packets(s.limit_bytes, mtu),
    probe=("tbf", "rate", "1mbit", "burst", "10000", "limit", "10000"),
    leaf_only=False,
)
