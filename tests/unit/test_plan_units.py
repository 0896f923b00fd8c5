"""Unit parsing: what researchers write becomes exact kernel units; ambiguous spellings are refused."""
from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from orchestrator.plan.model.quantities import PositiveTime, Rate, Size, Time
from orchestrator.plan.model.units import (
    format_rate,
    format_time_ns,
    parse_fraction,
    parse_rate,
    parse_size,
    parse_time,
    parse_time_ns,
)


@pytest.mark.parametrize(("text", "bits"), [
    ("200mbit", 200_000_000), ("1gbit", 10**9), ("5Gbit", 5 * 10**9), ("100 Mbit/s", 10**8),
    ("1.5kbit", 1500), ("64kibit", 65536), ("12bit", 12), ("0.5gbit", 500_000_000),
])
def test_parse_rate(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize(("text", "needle"), [
    ("100mbps", "megaBYTES"), ("100MBps", "megaBYTES"), ("100mb", "ambiguous"), ("200", "needs a unit"),
    ("fast", "cannot read"), ("0mbit", "positive"), ("0.1bit", "whole number"), ("20 furlongs", "unknown"),
    ("11tbit", "10 Tbit/s"),
])
def test_parse_rate_refuses(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_rate(text)


@pytest.mark.parametrize("value", [200, 2.5, None, True, ["1gbit"]])
def test_parse_rate_refuses_non_text(value: object) -> None:
    with pytest.raises(ValueError):
        parse_rate(value)


@pytest.mark.parametrize(("text", "ns"), [
    ("250us", 250_000), ("1.5ms", 1_500_000), ("40s", 40 * 10**9), ("2min", 120 * 10**9),
    ("300µs", 300_000), ("300μs", 300_000), ("17.768ms", 17_768_000), ("12ns", 12), (0, 0), ("0", 0),
])
def test_parse_time_ns(text: object, ns: int) -> None:
    assert parse_time_ns(text) == ns


def test_parse_time_seconds_float() -> None:
    assert parse_time("1.5ms") == pytest.approx(0.0015)


@pytest.mark.parametrize(("text", "needle"), [
    ("300", "needs a unit"), (300, "needs a unit"), ("5m", "ambiguous"), ("1.5ns", "whole number"),
    ("2 fortnights", "unknown"), ("8days", "unknown"), (1.5, "bare number"), ("200h", "longer than a week"),
])
def test_parse_time_refuses(text: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_time_ns(text)


@pytest.mark.parametrize(("text", "size"), [
    ("9000B", 9000), ("1500", 1500), (1500, 1500), ("64KiB", 65536), ("64KB", 64000), ("64kB", 64000),
    ("1MiB", 2**20), ("1.5KB", 1500), ("2GiB", 2 * 2**30),
])
def test_parse_size(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "needle"), [
    ("64kb", "bits"), ("9000b", "bits"), ("64k", "unknown"), ("1.5", "whole number"), ("2TiB", "unknown"),
    ("-1", "cannot read"), ("2000GiB", "1 TiB"),
])
def test_parse_size_refuses(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_size(text)


@pytest.mark.parametrize(("text", "value"), [
    ("1/16", 0.0625), ("10%", 0.1), ("0.25", 0.25), (0.25, 0.25), (1, 1.0), ("0.78125%", 0.0078125),
    ("100%", 1.0),
])
def test_parse_fraction(text: object, value: float) -> None:
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["1/0", "150%", "2", "half", "-0.1", True])
def test_parse_fraction_refuses(text: object) -> None:
    with pytest.raises(ValueError):
        parse_fraction(text)


def test_format_round_trips() -> None:
    for bits in (12, 1500, 20_000_000, 5 * 10**9):
        assert parse_rate(format_rate(bits)) == bits
    for ns in (0, 12, 250_000, 1_500_000, 40 * 10**9):
        assert parse_time_ns(format_time_ns(ns)) == ns
    assert format_rate(20_000_000) == "20mbit"
    assert format_time_ns(1_500_000) == "1500us"


def test_quantities_compare_by_value_and_keep_spelling() -> None:
    a, b = Rate("20Mbit"), Rate("20mbit")
    assert a == b and hash(a) == hash(b) and a.raw == "20Mbit"
    assert Rate("20mbit") != Rate("50mbit")
    assert Size("1500") != Time("1500ns")  # different dimensions never compare equal
    ta = TypeAdapter(Rate)
    assert ta.dump_python(ta.validate_python("5Gbit"), mode="json") == "5Gbit"
    assert Time("250us").number == pytest.approx(250e-6)


def test_positive_time_refuses_zero() -> None:
    with pytest.raises(ValidationError, match="greater than zero"):
        TypeAdapter(PositiveTime).validate_python("0s")
