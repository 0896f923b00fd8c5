"""Typed plan quantities: a value in kernel units that remembers how the researcher wrote it.

`Rate("20mbit").value == 20_000_000` and `.raw == "20mbit"`. Equality and hashing use the value only, so
`20Mbit == 20mbit`. In JSON mode a quantity serialises back to what was written (the expansion re-reads
it), and its JSON Schema carries the accepted pattern, the unit and an example.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import core_schema

from orchestrator.plan.model import units


class Quantity:
    """Base of the unit-typed plan values; subclasses say how to parse and what to call the unit."""

    __slots__ = ("raw", "value")
    unit: ClassVar[str] = ""
    suffix: ClassVar[str] = ""        # name suffix of the numeric companion in run params ("rate_bit")
    example: ClassVar[str] = ""
    parser: ClassVar[Callable[[object], Any]]
    json_schema: ClassVar[dict[str, Any]] = {}

    def __init__(self, raw: object) -> None:
        self.value = type(self).parser(raw)
        self.raw: str | int | float = raw if isinstance(raw, (str, int, float)) else str(raw)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.value == self.value  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.value))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.raw!r})"

    def __str__(self) -> str:
        return str(self.raw)

    @property
    def number(self) -> int | float:
        """The value as stored in run params next to the written text (`rate_bit`, `base_rtt_s`)."""
        return self.value

    @classmethod
    def _validate(cls, v: object) -> Quantity:
        return v if isinstance(v, cls) else cls(v)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda q: q.raw, when_used="json"),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**cls.json_schema, "unit": cls.unit, "examples": [cls.example]}


class Rate(Quantity):
    """A rate; value in bit/s (int)."""

    unit, suffix, example = "bit/s (write bit, kbit, mbit, gbit, tbit)", "bit", "200mbit"
    parser = staticmethod(units.parse_rate)
    json_schema = {"type": "string", "pattern": units.RATE_PATTERN}


class Time(Quantity):
    """A time; value in nanoseconds (int). `.seconds` gives a float."""

    unit, suffix, example = "time (write ns, us, ms, s, min, h)", "s", "1.5ms"
    parser = staticmethod(units.parse_time_ns)
    json_schema = {"anyOf": [{"type": "string", "pattern": units.TIME_PATTERN}, {"const": 0}]}

    @property
    def seconds(self) -> float:
        return self.value / 1e9

    @property
    def number(self) -> float:
        return self.seconds


class Size(Quantity):
    """A size; value in bytes (int). A bare integer means bytes."""

    unit, suffix, example = "bytes (write B, KB, MB, GB, KiB, MiB, GiB or a bare byte count)", "bytes", "64KiB"
    parser = staticmethod(units.parse_size)
    json_schema = {"anyOf": [{"type": "integer", "minimum": 0},
                             {"type": "string", "pattern": units.SIZE_PATTERN}]}


class Fraction(Quantity):
    """A fraction in [0, 1]; value is a float."""

    unit, suffix, example = "fraction in [0, 1] (write 1/16, 10% or 0.1)", "frac", "1/16"
    parser = staticmethod(units.parse_fraction)
    json_schema = {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1},
                             {"type": "string", "pattern": units.FRACTION_PATTERN}]}


class Threshold(Quantity):
    """An AQM threshold: a time, or relative to the BDP (`0.17bdp` = 0.17 x base RTT) or to the target queue
    (`3target`). `.value` is (unit, number); `in_ns` gives nanoseconds for one run."""

    unit, suffix, example = "time, or a multiple of the BDP / target queue (write 500us, 0.17bdp, 3target)", \
        "spec", "500us"
    parser = staticmethod(units.parse_threshold)
    json_schema = {"type": "string", "pattern": units.THRESHOLD_PATTERN}

    @property
    def number(self) -> str:
        return str(self.raw)

    def in_ns(self, rtt_ns: int | None, target_ns: int | None) -> int:
        """Nanoseconds for one run, given the run's base RTT and target queue delay (relative values)."""
        kind, x = self.value
        if kind == "ns":
            return int(x)
        ref = rtt_ns if kind == "bdp" else target_ns
        if ref is None:
            raise ValueError(f"{self.raw!r} is relative to the {'base RTT' if kind == 'bdp' else 'target'}, "
                             "which this run does not state")
        return int(x * ref)



class Buffer(Quantity):
    """A buffer: bytes, a time at the bottleneck rate (`200ms`) or a multiple of the BDP (`1bdp`)."""

    unit, suffix, example = "bytes, time at the bottleneck rate, or a multiple of the BDP (write 150KB, 200ms, " \
        "1bdp)", "spec", "1bdp"
    parser = staticmethod(units.parse_buffer)
    json_schema = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": units.BUFFER_PATTERN}]}

    @property
    def number(self) -> str:
        return str(self.raw)

    def in_bytes(self, rate_bit: int | None, rtt_ns: int | None) -> int:
        """Bytes for one run (BDP and time need the bottleneck rate; BDP also the base RTT)."""
        kind, x = self.value
        if kind == "bytes":
            return int(x)
        if rate_bit is None or (kind == "bdp" and rtt_ns is None):
            raise ValueError(f"{self.raw!r} needs the bottleneck rate{' and base RTT' if kind == 'bdp' else ''}")
        ns = x * rtt_ns if kind == "bdp" else x
        return -(-int(rate_bit * ns) // (8 * 10**9))



def _positive(q: Quantity) -> Quantity:
    value = q.value[1] if isinstance(q.value, tuple) else q.value
    if value <= 0:
        raise ValueError(f"must be greater than zero, got {q.raw!r}")
    return q


PositiveTime = Annotated[Time, AfterValidator(_positive)]
PositiveSize = Annotated[Size, AfterValidator(_positive)]
PositiveThreshold = Annotated[Threshold, AfterValidator(_positive)]
PositiveBuffer = Annotated[Buffer, AfterValidator(_positive)]
