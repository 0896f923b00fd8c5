"""Pure parsing and argv building for interrupt coalescing (`ethtool -c/-C`) and pause frames (`ethtool -a/-A`).

ethtool 6.1 prints coalescing only as text (`--json -c` is refused), pause frames as JSON. A driver without
the operation (veth, virtio for pause) answers "Operation not supported": that is recorded as such, never
mistaken for "off".
"""
from __future__ import annotations

import json
import re

from schemas.nic import COALESCE_BOOL_NAMES, COALESCE_INT_NAMES, COALESCE_NAMES, PAUSE_NAMES

# ethtool -c prints "rx-frame-low" but -C takes "rx-frames-low" (ethtool 6.1 source, netlink/coalesce.c)
_PRINTED_ALIASES = {"rx-frame-low": "rx-frames-low", "tx-frame-low": "tx-frames-low",
                    "rx-frame-high": "rx-frames-high", "tx-frame-high": "tx-frames-high"}
_PAIR_LINE = re.compile(r"^(Adaptive|CQE mode) RX:\s*(\S+)\s+TX:\s*(\S+)\s*$")
_PAIR_PREFIX = {"Adaptive": "adaptive", "CQE mode": "cqe-mode"}
UNSUPPORTED = "Operation not supported"


class EthtoolParseError(ValueError):
    pass


def _onoff(word: str) -> bool | None:
    return {"on": True, "off": False}.get(word)


def parse_coalesce(text: str) -> dict[str, int | bool]:
    """`ethtool -c IF` text -> the parameters this driver has (n/a ones are left out)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Coalesce parameters for "):
        raise EthtoolParseError(f"not `ethtool -c` output: {text[:60]!r}")
    out: dict[str, int | bool] = {}
    for line in lines[1:]:
        if not line.strip():
            continue
        if m := _PAIR_LINE.match(line):
            prefix = _PAIR_PREFIX[m.group(1)]
            for side, word in (("rx", m.group(2)), ("tx", m.group(3))):
                if (value := _onoff(word)) is not None:
                    out[f"{prefix}-{side}"] = value
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise EthtoolParseError(f"unexpected `ethtool -c` line: {line!r}")
        value = value.strip()
        if value == "n/a":
            continue
        name = _PRINTED_ALIASES.get(name.strip(), name.strip())
        if name not in COALESCE_INT_NAMES or not value.isdigit():
            raise EthtoolParseError(f"unexpected `ethtool -c` line: {line!r}")
        out[name] = int(value)
    return out


def parse_pause_json(text: str) -> dict[str, bool]:
    """`ethtool --json -a IF` -> {autoneg, rx, tx}."""
    doc = json.loads(text)
    if not doc:
        raise EthtoolParseError("`ethtool --json -a` printed no interface")
    entry = doc[0]
    return {"autoneg": bool(entry["autonegotiate"]), "rx": bool(entry["rx"]), "tx": bool(entry["tx"])}


def unsupported_reason(returncode: int, stderr: str) -> str | None:
    """The driver lacks the operation (as opposed to a failure worth raising)."""
    return stderr.strip() if returncode != 0 and UNSUPPORTED in stderr else None


def coalesce_argv(dev: str, values: dict[str, int | bool]) -> list[str]:
    argv = ["ethtool", "-C", dev]
    for name in sorted(values):
        if name not in COALESCE_NAMES:
            raise ValueError(f"not an ethtool -C parameter: {name!r}")
        value = values[name]
        argv += [name, ("on" if value else "off") if name in COALESCE_BOOL_NAMES else str(int(value))]
    return argv


def pause_argv(dev: str, pause: dict[str, bool]) -> list[str]:
    argv = ["ethtool", "-A", dev]
    for name in PAUSE_NAMES:
        if name in pause:
            argv += [name, "on" if pause[name] else "off"]
    return argv
