"""Pure parsing for what a data interface is, beyond its qdiscs: its MTU and MTU range (`ip -d -j link show`),
its speed (`ethtool IF`), the offload features its driver fixed (`ethtool -k IF`) and what to ask of them.

A virtual driver's speed says nothing about a wire: veth and tun print a constant "10000Mb/s", virtio_net
"Unknown!" unless the hypervisor sets one, and QEMU's emulated e1000 always "1000Mb/s". Such a speed is
recorded but never compared with a plan's `line_rate` (G-NIC, docs/guards.md).
"""
from __future__ import annotations

import json
import re

from schemas.nic import OFFLOAD_LONG_NAMES
from schemas.protocol import LinkSpeed

# drivers whose reported speed is not a physical link's: software devices and hypervisors' emulated NICs
# (e1000 is QEMU's default emulated NIC; real e1000 PCI cards are gone, their successors are e1000e/igb)
VIRTUAL_DRIVERS = frozenset({"veth", "tun", "virtio_net", "bridge", "macvlan", "ipvlan", "vxlan", "dummy", "ifb",
                             "e1000", "vmxnet3", "hv_netvsc", "vif", "xen-netfront", "ena"})
_SPEED = re.compile(r"^\s*Speed:\s*(?:(\d+)Mb/s|Unknown!)\s*$")
_FEATURE = re.compile(r"^(\t?)([a-z0-9_-]+): (on|off)((?: \[[a-z ]+\])*)$")   # "off [fixed]", "off [requested on]"
MAX_FEATURE_LINES = 512   # ethtool 6.1 prints ~80; a bound on what a root agent parses


class LinkParseError(ValueError):
    pass


def parse_speed(text: str) -> int | None:
    """`ethtool IF` -> its `Speed:` in Mb/s; None for "Unknown!" or a driver that prints no speed at all."""
    for line in text.splitlines():
        if m := _SPEED.match(line):
            return int(m.group(1)) if m.group(1) else None
    return None


def link_speed(text: str, driver: str) -> LinkSpeed:
    mbps = parse_speed(text)
    if driver in VIRTUAL_DRIVERS:
        return LinkSpeed(mbps=mbps, checkable=False, why=f"driver {driver} is virtual: its speed is not a wire's")
    if mbps is None:
        return LinkSpeed(mbps=None, checkable=False, why=f"driver {driver or '?'} reports no speed")
    return LinkSpeed(mbps=mbps, checkable=True)


def parse_features_text(text: str) -> dict[str, tuple[bool, bool, list[str]]]:
    """`ethtool -k IF` -> long name -> (active, fixed, the long names of its sub-features). ethtool prints a
    feature made of several (tx-checksumming, scatter-gather, tcp-segmentation-offload) without `[fixed]`
    even when each part is fixed; its parts follow it, indented by a tab."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Features for "):
        raise LinkParseError(f"not `ethtool -k` output: {text[:60]!r}")
    out: dict[str, tuple[bool, bool, list[str]]] = {}
    parent = None
    for line in lines[1:MAX_FEATURE_LINES]:
        m = _FEATURE.match(line)
        if m is None:
            raise LinkParseError(f"unexpected `ethtool -k` line: {line!r}")
        child, name, value, marks = m.groups()
        out[name] = (value == "on", "[fixed]" in marks, [])
        if child and parent is not None:
            out[parent][2].append(name)
        elif not child:
            parent = name
    return out


def fixed_offloads(text: str) -> dict[str, bool]:
    """The `ethtool -K` features (short names) the driver fixed, at the value it fixed them: `[fixed]`, or a
    feature made of parts that are all fixed."""
    feats = parse_features_text(text)
    out = {}
    for short, long in OFFLOAD_LONG_NAMES.items():
        if long not in feats:
            continue
        active, fixed, parts = feats[long]
        if fixed or (parts and all(feats[p][1] for p in parts)):
            out[short] = active
    return out


def parse_link(text: str) -> tuple[int, int, int]:
    """`ip -d -j link show dev IF` -> (mtu, min_mtu, max_mtu)."""
    try:
        [link] = json.loads(text)
        return int(link["mtu"]), int(link.get("min_mtu", 68)), int(link.get("max_mtu", 65535))
    except (ValueError, KeyError, TypeError) as exc:
        raise LinkParseError(f"not `ip -d -j link show` of one interface: {exc}") from None


def link_argv(dev: str) -> list[str]:
    return ["ip", "-d", "-j", "link", "show", "dev", dev]


def mtu_argv(dev: str, mtu: int) -> list[str]:
    if not 68 <= mtu <= 65535:
        raise ValueError(f"MTU {mtu} outside 68..65535")
    return ["ip", "link", "set", "dev", dev, "mtu", str(mtu)]


def offload_request(feats: dict[str, dict], wanted: dict[str, bool]) -> dict[str, bool]:
    """The `ethtool -K` settings to ask for (pure). `feats`: `ethtool --json -k` per feature (active, fixed,
    requested); `wanted`: short name -> on, each a known, changeable feature (the executor checked). The
    features whose state differs; and, when a changeable feature of the device is active but not requested
    (or requested but not active), every wanted one: such a driver set a feature behind the core's back --
    UML's vector NIC turns TSO on when it opens, outside the requested set ("tx-tcp-segmentation: on
    [requested off]") -- and the next update of the device's features (any `ethtool -K`, an MTU change)
    recomputes them from the requested set and drops it. Asked for explicitly, it stays."""
    changes = {short: on for short, on in wanted.items()
               if bool(feats[OFFLOAD_LONG_NAMES[short]]["active"]) != on}
    drifted = any(not f.get("fixed") and f.get("requested") is not None and bool(f["active"]) != bool(f["requested"])
                  for f in feats.values())
    if drifted:
        return {short: on for short, on in wanted.items() if not feats[OFFLOAD_LONG_NAMES[short]].get("fixed")}
    return changes
