"""What a qdisc kind declares (`QdiscKind`), and the small pieces its declarations are built from.

A kind lives in one module of this package and is one `QdiscKind`: its typed stage (kernel units, the
`apply` contract), the tc parameters that build it, what `tc -s -d -j qdisc show` must show for it
(`Expect`s, with the tolerance tc's rounding needs), how many packets it can hold (G-NETEM), whether it
can take a child qdisc, and what the agent's capability probe adds to a scratch veth to know the kernel
has it. Everything here is pure: no process is started, nothing is read from the host.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


StageT = TypeVar("StageT", bound=Strict)


# --- tc syntax ---------------------------------------------------------------------------------------

def tc_time(ns: int) -> str:
    """A time for tc: whole microseconds where exact (tc's parser is microsecond-based), else fractional."""
    return f"{ns // 1000}us" if ns % 1000 == 0 else f"{ns / 1000:.3f}us"


def opt(name: str, value: object | None, fmt: Callable[[Any], str] = str) -> list[str]:
    """`name value`, or nothing when the stage leaves the option to tc's default."""
    return [] if value is None else [name, fmt(value)]


def flag(on: bool | None, yes: str, no: str | None) -> list[str]:
    """A tc flag word: `yes` when on, `no` (if tc has one) when off, nothing when unset."""
    if on is None:
        return []
    return [yes] if on else ([no] if no else [])


def bits(rate_bit: int) -> str:
    return f"{rate_bit}bit"


SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMG]?)b$")


def parse_tc_size(text: str) -> int:
    """tc's printed sizes ("15Kb", "1514b", "1Mb"): 1024-based multipliers."""
    m = SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a tc size: {text!r}")
    return int(float(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2)])


def us(ns: int | None) -> int | None:
    """ns -> the whole microseconds tc's JSON prints times in."""
    return None if ns is None else ns // 1000


# --- comparisons: how close a read-back value must be to the wanted one --------------------------------

Equal = Callable[[Any, Any], bool]


def exact(got: Any, want: Any) -> bool:
    return got == want


def tc_rounded(got: Any, want: Any) -> bool:
    """Rates and floats as tc prints them (bytes/s from a rate in bit/s, six significant digits): within
    0.1 % or, above 100, one unit."""
    if isinstance(want, (bool, str)) or got is None or isinstance(got, (bool, str)):
        return got == want
    w = float(want)
    return abs(float(got) - w) <= max(1e-6, 1e-3 * abs(w), 1.0 if w > 100 else 0)


def tc_size(got: Any, want: Any) -> bool:
    """Sizes tc prints rounded to 1024-multiples ("32Kb" for 32762 B) or cut by its µs ticks: within 2 % or 1 KiB."""
    return isinstance(got, (int, float)) and abs(got - want) <= max(1024, 0.02 * want)


def tc_seconds(got: Any, want: Any) -> bool:
    """A time tc's JSON prints in seconds after the same whole-µs truncation and tick conversion as whole_us
    (netem: 500 µs reads back 0.000499): within 2 µs or 0.1 %. A float difference at the limit of its precision
    must not decide, so the bound is in whole nanoseconds."""
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return False
    return round(abs(got - want) * 1e9) <= max(2000, round(1e-3 * abs(want) * 1e9))


def whole_us(got: Any, want: Any) -> bool:
    """A time in whole µs that went through coarser units and truncations on the way (codel keeps 1024 ns
    units, psched 64 ns ticks; tc truncates to µs, tbf's `lat` twice): within 2 µs or 0.1 %."""
    return isinstance(got, (int, float)) and abs(got - want) <= max(2.0, 1e-3 * abs(want))


# --- expected read-back ---------------------------------------------------------------------------------

_MISSING = object()


@dataclass(frozen=True)
class Expect:
    """One option as `tc -s -d -j qdisc show` must show it.

    `path` leads into the stage's read-back document: the qdisc's JSON object, with the parameters of its
    class under "class" for a classful kind. `want` is in tc's units (µs, bytes, bytes/s); None means the
    stage left the option to tc's default, so there is nothing to compare. `absent` is what tc means by
    leaving the key out (it prints some flags only when set); `present` reads the key's presence as the
    value (tc prints a set flag as `"key": null`). `read` converts tc's printed form (e.g. tbf's burst
    string "5000b/1") before the comparison. `fields` names the stage fields the check covers.
    """

    label: str
    path: tuple[str, ...]
    want: object
    fields: tuple[str, ...]
    equal: Equal = exact
    absent: object = None
    present: bool = False
    read: Callable[[Any], Any] | None = None
    unit: str = ""
    why: str = ""

    def shown(self, doc: Mapping[str, Any]) -> Any:
        got: Any = doc
        for key in self.path:
            got = got.get(key, _MISSING) if isinstance(got, Mapping) else _MISSING
        if self.present:
            return got is not _MISSING
        if got is _MISSING:
            return self.absent
        return self.read(got) if self.read is not None and got is not None else got

    def difference(self, doc: Mapping[str, Any]) -> str | None:
        """None when tc shows the wanted value (or the stage wants tc's default), else a named mismatch."""
        if self.want is None:
            return None
        got = self.shown(doc)
        if got is not None and self.equal(got, self.want):
            return None
        unit = f" {self.unit}" if self.unit else ""
        why = f" ({self.why})" if self.why else ""
        return f"{self.label} {got} != {self.want}{unit}{why}"


# --- the kind ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QdiscKind(Generic[StageT]):
    """Everything tcplab knows about one qdisc kind. The walk test (tests/unit/test_qdisc_kinds.py) fails
    when a part is missing. A part left None is a gap the kind must name in `pending`."""

    stage: type[StageT]
    """the typed stage model; its `kind` literal is the kind's name"""
    params: Callable[[StageT], list[str]] | None
    """tc parameters after `tc qdisc add dev D parent P handle H:` (stock iproute2 syntax)"""
    expected: Callable[[StageT], list[Expect]] | None
    """what `tc -s -d -j qdisc show` must show for the stage, option by option"""
    buffer_packets: Callable[[StageT, int], int]
    """packets the stage can hold, given the MTU (G-NETEM adds it below a netem)"""
    probe: tuple[str, ...] | None
    """parameters the capability probe adds as the root qdisc of a scratch veth"""
    leaf_only: bool
    """True when it cannot take a child qdisc at i:1 (netem, htb and tbf have one inner class)"""
    default_limit_packets: int | None = None
    """the packet limit tc / the kernel applies when the stage leaves `limit_packets` unset"""
    class_params: Callable[[StageT], list[str]] | None = None
    """classful kinds: tc parameters of the class i+1:1 the next stage hangs below"""
    class_readback: Callable[[str, list[dict], str], dict | None] | None = None
    """classful kinds: the class's read-back (classid, netlink classes, `tc -d class show` text) or None"""
    unseen: Mapping[str, str] = field(default_factory=dict)
    """stage field -> why tc's read-back cannot show it (so it is applied but not compared)"""
    pending: str | None = None
    """why this agent version cannot apply the kind yet; its argv, read-back and probe are then None"""
    netlink: Callable[[StageT], bytes] | None = None
    """kinds stock tc cannot configure (tcplab's own modules; dualpi2): the raw TCA_OPTIONS the agent sends in an
    RTM_NEWQDISC instead of running tc (schemas/rawqdisc.py); `params` is then None. Their read-back is the
    kernel's dump of the options, under "netlink" ({options_hex, xstats_hex}) in the read-back document"""
    netlink_nested: bool = False
    """netlink kinds whose qdisc parses TCA_OPTIONS with nla_parse_nested (not _deprecated): the nest must carry
    NLA_F_NESTED or the kernel refuses it (EINVAL; dualpi2)"""
    kernel_kind: str | None = None
    """the kernel's name of the kind (TCA_KIND, what tc prints) when it is not the stage's"""
    xstats: Callable[[bytes], dict] | None = None
    """kinds whose TCA_XSTATS pyroute2 cannot decode: their decoder (the qdisc poller records the last sample)"""
    module: str | None = None
    """the module that provides the kind when the kernel cannot load it on demand (one of tcplab's own,
    experiments/modules/): the agent loads it from its module directories before the probe and the apply"""

    @property
    def name(self) -> str:
        return self.stage.model_fields["kind"].default

    @property
    def tc_kind(self) -> str:
        """TCA_KIND: what the kernel (and tc) calls it."""
        return self.kernel_kind or self.name


def limit_or_default(limit_packets: int | None, default: int | None) -> int:
    """Packets a packet-limited queue holds: its limit, else tc's default (0 when only memory bounds it)."""
    if limit_packets is not None:
        return limit_packets
    return default or 0


def bytes_in_packets(limit_bytes: int, mtu: int) -> int:
    """Full-size packets a byte-limited queue holds, rounded up."""
    return -(-limit_bytes // mtu)
