"""Unit parsing for plan values: rates, times, sizes and fractions, written the way researchers write them.

Pure functions from text to kernel units (bit/s, nanoseconds, bytes, a float in [0, 1]). Every failure is
a `ValueError` whose message says what was expected, because the plan validator shows it verbatim next to
the offending line. Arithmetic is exact (`Decimal`), so `1.5ms` is 1 500 000 ns, not a float near it.

Numbers are bounded before any arithmetic (`MAX_NUMBER_CHARS` characters, exponents within
`MAX_EXPONENT`): `Fraction(Decimal("1e-999999999"))` would build a billion-digit integer.

Ambiguous spellings are refused rather than guessed: `mbps` (tc reads it as megaBYTES per second), a
bare number for a rate or a time, `64kb` (bits or bytes?), and `m` (metres? minutes? milli?).
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from orchestrator.plan.model.bounds import MAX_EXPONENT, MAX_NUMBER_CHARS

_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>[^\s0-9.][^\s]*)?\s*$")

# Decimal prefixes for rates follow tc (kbit = 1000 bit/s); IEC prefixes are accepted too.
RATE_UNITS: dict[str, int] = {
    "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
}
# Sizes are bytes; decimal and IEC prefixes both mean what they say (KB = 1000 B, KiB = 1024 B).
SIZE_UNITS: dict[str, int] = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
}
TIME_UNITS_NS: dict[str, int] = {
    "ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9, "min": 60 * 10**9,
    "h": 3600 * 10**9,
}

RATE_PATTERN = r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*[A-Za-z]+(/s)?\s*$"
TIME_PATTERN = r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*(ns|us|µs|μs|ms|s|min|h)\s*$"
SIZE_PATTERN = r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*(([KkMmGg][iI]?)?B)?\s*$"
FRACTION_PATTERN = r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*(%|/\s*[0-9]+)?\s*$"

# Largest values accepted: far beyond any testbed, small enough that a typo (an extra 000) is caught.
MAX_RATE_BIT = 10**13          # 10 Tbit/s
MAX_TIME_NS = 7 * 24 * 3600 * 10**9   # one week
MAX_SIZE_BYTES = 2**40         # 1 TiB
_DECIMAL = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,4})?$")


def bounded_decimal(text: str, original: object) -> Decimal:
    """The number written in `text` as an exact Decimal, refused (ValueError) when it is too long or its
    exponent too large for exact arithmetic to stay cheap, and when it is not a finite decimal."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"the number in {_shown(original)} has more than {MAX_NUMBER_CHARS} characters")
    if not _DECIMAL.match(text):
        raise ValueError(f"cannot read the number in {_shown(original)}")
    number = Decimal(text)
    if number and not -MAX_EXPONENT <= number.adjusted() <= MAX_EXPONENT:
        raise ValueError(f"the number in {_shown(original)} is outside 1e-{MAX_EXPONENT} .. 1e{MAX_EXPONENT}")
    return number


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _split(text: object, kind: str, example: str) -> tuple[Decimal, str]:
    """Split '20 mbit' into (Decimal('20'), 'mbit'); the unit is '' when absent."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected a {kind} such as {example!r}, got {type(text).__name__}")
    if isinstance(text, float):
        raise ValueError(f"expected a {kind} with a unit such as {example!r}, got the bare number {text!r}")
    m = _QUANTITY.match(str(text))
    if not m:
        raise ValueError(f"cannot read {_shown(text)} as a {kind}; write e.g. {example!r}")
    return bounded_decimal(m.group("num"), text), m.group("unit") or ""


def _exact_int(value: Decimal, text: object, what: str) -> int:
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of {what}")
    return int(value)


def parse_rate(text: object) -> int:
    """Parse a rate such as '200mbit', '1gbit', '5Gbit' or '100 Mbit/s' into bit/s (a positive int)."""
    number, unit = _split(text, "rate", "200mbit")
    if not unit:
        raise ValueError(f"the rate {text!r} needs a unit: bit, kbit, mbit, gbit (e.g. '200mbit')")
    key = unit.lower().removesuffix("/s")
    if key.endswith("bps") or key in {"b", "kb", "mb", "gb", "tb"}:
        raise ValueError(
            f"ambiguous rate unit {unit!r}: tc reads 'mbps' as megaBYTES per second and 'mb' may be bytes;"
            f" write bits, e.g. '{number}mbit'")
    if key not in RATE_UNITS:
        raise ValueError(f"unknown rate unit {unit!r}; use one of {', '.join(RATE_UNITS)}")
    bits = _exact_int(number * RATE_UNITS[key], text, "bit/s")
    if bits <= 0:
        raise ValueError(f"a rate must be positive, got {text!r}")
    if bits > MAX_RATE_BIT:
        raise ValueError(f"the rate {text!r} is above 10 Tbit/s; check the unit")
    return bits


def parse_time_ns(text: object) -> int:
    """Parse a time such as '250us', '1.5ms', '40s' or '2min' into nanoseconds (a non-negative int)."""
    number, unit = _split(text, "time", "1.5ms")
    if not unit and number == 0:
        return 0  # zero needs no unit
    if not unit:
        raise ValueError(f"the time {text!r} needs a unit: ns, us, ms, s, min (e.g. '250us', '40s')")
    if unit == "m":
        raise ValueError(f"ambiguous time unit 'm' in {text!r}: write 'ms' or 'min'")
    if unit.startswith(":"):   # YAML 1.1 read 1:30:00 as base 60 (5400); the plan reads it as written
        raise ValueError(f"{_shown(text)} is not a time: write a number and a unit, e.g. '90min' or '5400s'")
    if unit not in TIME_UNITS_NS:
        raise ValueError(f"unknown time unit {unit!r}; use one of ns, us, ms, s, min, h")
    ns = _exact_int(number * TIME_UNITS_NS[unit], text, "nanoseconds")
    if ns > MAX_TIME_NS:
        raise ValueError(f"the time {text!r} is longer than a week; check the unit")
    return ns


def parse_time(text: object) -> float:
    """Parse a time into seconds (float). Use `parse_time_ns` where exactness matters."""
    return parse_time_ns(text) / 1e9


def parse_size(text: object) -> int:
    """Parse a size such as '9000B', '1500', '64KiB' or '1MB' into bytes. A bare integer means bytes."""
    number, unit = _split(text, "size", "64KiB")
    if unit and unit != "B" and unit.endswith("b"):
        raise ValueError(f"{unit!r} in {text!r} reads as bits; a size is bytes: write e.g. '64KB' or '64KiB'")
    key = unit.lower()
    if key and key not in SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r}; use B, KB, MB, GB, KiB, MiB or GiB (or a bare byte count)")
    size = _exact_int(number * SIZE_UNITS[key or "b"], text, "bytes")
    if size > MAX_SIZE_BYTES:
        raise ValueError(f"the size {text!r} is above 1 TiB; check the unit")
    return size


def parse_fraction(text: object) -> float:
    """Parse a fraction such as '1/16', '10%', '0.25' or 0.25 into a float in [0, 1]."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected a fraction such as '1/16' or '10%', got {type(text).__name__}")
    if isinstance(text, float) and not math.isfinite(text):
        raise ValueError(f"the fraction {text!r} is not a finite number")
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            value = Fraction(bounded_decimal(raw[:-1], text)) / 100
        elif "/" in raw:
            num, _, den = raw.partition("/")
            value = Fraction(bounded_decimal(num, text)) / Fraction(bounded_decimal(den, text))
        else:
            value = Fraction(bounded_decimal(raw, text))
    except (InvalidOperation, ZeroDivisionError, ValueError) as exc:
        raise ValueError(f"cannot read {_shown(text)} as a fraction; write e.g. '1/16', '10%' or 0.1 "
                         f"({exc})") from None
    if not 0 <= value <= 1:
        raise ValueError(f"the fraction {_shown(text)} is outside [0, 1]")
    return float(value)


# Study thresholds and buffers are often relative: "K = 0.17 x BDP", "buffer = 1 x BDP", ramp max = 3 x the
# target queue. These units keep such a plan faithful to the study; expansion converts them per run.
RELATIVE_UNITS = ("bdp", "target")
THRESHOLD_PATTERN = r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*(ns|us|µs|μs|ms|s|bdp|target)\s*$"
BUFFER_PATTERN = (r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*(ns|us|µs|μs|ms|s|bdp|(([KkMmGg][iI]?)?B))?\s*$")


def _relative(text: object, allowed: tuple[str, ...]) -> tuple[str, Fraction] | None:
    if isinstance(text, str):
        m = _QUANTITY.match(text)
        if m and (m.group("unit") or "").lower() in allowed:
            value = Fraction(bounded_decimal(m.group("num"), text))
            if not 0 < value <= 1000:
                raise ValueError(f"{text!r}: the multiple must be in (0, 1000]")
            return m.group("unit").lower(), value
    return None


def parse_threshold(text: object) -> tuple[str, int | Fraction]:
    """An AQM threshold: a time ('500us' -> ('ns', 500000)), a multiple of the base RTT's BDP
    ('0.17bdp' -> ('bdp', 17/100), i.e. 0.17 x RTT in time) or of the target queue ('3target')."""
    rel = _relative(text, RELATIVE_UNITS)
    if rel:
        return rel
    try:
        return "ns", parse_time_ns(text)
    except ValueError as exc:
        raise ValueError(f"{exc}; thresholds may also be relative: '0.17bdp' or '3target'") from None


def parse_buffer(text: object) -> tuple[str, int | Fraction]:
    """A buffer size: bytes ('150KB', 18750 -> ('bytes', n)), a time at the bottleneck rate ('200ms' ->
    ('ns', n)) or a multiple of the BDP ('1bdp' -> ('bdp', 1))."""
    rel = _relative(text, ("bdp",))
    if rel:
        return rel
    if isinstance(text, str):
        m = _QUANTITY.match(text)
        if m and (m.group("unit") or "") in TIME_UNITS_NS:
            return "ns", parse_time_ns(text)
    return "bytes", parse_size(text)


def format_rate(bit_s: int) -> str:
    """The shortest exact tc-style spelling of a rate: 20000000 -> '20mbit'."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bit_s % RATE_UNITS[unit] == 0:
            return f"{bit_s // RATE_UNITS[unit]}{unit}"
    return f"{bit_s}bit"


def format_time_ns(ns: int) -> str:
    """The shortest exact spelling of a time: 1500000 -> '1500us', 5000000000 -> '5s'."""
    for unit in ("s", "ms", "us"):
        if ns % TIME_UNITS_NS[unit] == 0:
            return f"{ns // TIME_UNITS_NS[unit]}{unit}"
    return f"{ns}ns"
