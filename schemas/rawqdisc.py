"""Qdiscs that tc cannot configure or print (kinds of tcplab's own modules, e.g. `aqm_mark`; `dualpi2` before
iproute2 6.17): an RTM_NEWQDISC with raw TCA_OPTIONS bytes, and a qdisc dump that returns their options and
xstats as the kernel's bytes (hex). Effects (pyroute2, netlink); the bytes themselves are each kind's pure
encoder (schemas/qdiscs/mark_netlink.py, dualpi2_netlink.py).

One implementation for the agent's apply and read-back (agents/host/) and the manager's command-line tools
(orchestrator/kernel/mark_nl.py, dualpi2_nl.py). pyroute2 passes the options of a kind it does not know through
as bytes and shows them back as hex ("08:00:01:00"), which is what is recorded.
"""
from __future__ import annotations

from collections.abc import Iterable


def parse_handle(text: str) -> int:
    """tc's "2:1" / "3:" / "root" -> the 32-bit handle."""
    if text == "root":
        return 0xFFFFFFFF
    major, _, minor = text.partition(":")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


def handle_text(h: int) -> str:
    """A netlink 32-bit handle as tc prints it: "1:" for a qdisc (minor 0), "1:1" for a class, "root"."""
    if h == 0xFFFFFFFF:
        return "root"
    return f"{h >> 16:x}:" if h & 0xFFFF == 0 else f"{h >> 16:x}:{h & 0xFFFF:x}"


def hex_bytes(value: object) -> str:
    """pyroute2's "08:00:01:00" (or bytes) -> "08000100"; "" when absent. A kind pyroute2 decodes itself is not
    one of ours: its decoded object is refused rather than guessed at."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, str):
        return value.replace(":", "")
    raise TypeError(f"pyroute2 decoded these options itself ({type(value).__name__}): not a raw qdisc kind")


def configure(dev: str, parent: str, handle: str, kind: str, options: bytes, command: str = "add",
              nested_flag: bool = False) -> None:
    """RTM_NEWQDISC with TCA_KIND `kind` and the raw TCA_OPTIONS nest (add: create, fail if present; change:
    modify the existing one). `nested_flag`: set NLA_F_NESTED on TCA_OPTIONS, which a qdisc parsing it with
    nla_parse_nested (not _deprecated) requires (dualpi2: EINVAL without it). Raises pyroute2's NetlinkError
    with the kernel's errno."""
    from pyroute2 import IPRoute
    from pyroute2.netlink import NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=dev)
        if not found:
            raise ValueError(f"no interface {dev}")
        msg = tcmsg()
        msg["family"], msg["index"] = 0, found[0]
        msg["handle"], msg["parent"] = parse_handle(handle), parse_handle(parent)
        msg["attrs"] = [("TCA_KIND", kind), ("TCA_OPTIONS", options, NLA_F_NESTED if nested_flag else 0)]
        flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if command == "add" else 0)
        ipr.status.setdefault("nlm_generator", False)   # pyroute2 0.9's sync nlm_request reads this key
        tuple(ipr.nlm_request(msg, msg_type=RTM_NEWQDISC, msg_flags=flags))


def dump(dev: str, kinds: Iterable[str]) -> list[dict]:
    """Every qdisc of one of `kinds` on `dev`: {handle, parent, kind, options_hex, xstats_hex, stats} (the
    kernel's TCA_OPTIONS and TCA_XSTATS bytes, undecoded; stats: TCA_STATS packets, drop, overlimits, qlen,
    backlog)."""
    from pyroute2 import IPRoute

    wanted = set(kinds)
    out = []
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=dev)
        if not found:
            return []
        for q in ipr.get_qdiscs(index=found[0]):
            kind = q.get_attr("TCA_KIND")
            if kind not in wanted:
                continue
            stats = q.get_attr("TCA_STATS")
            out.append({"handle": handle_text(q["handle"]), "parent": handle_text(q["parent"]), "kind": kind,
                        "options_hex": hex_bytes(q.get_attr("TCA_OPTIONS")),
                        "xstats_hex": hex_bytes(q.get_attr("TCA_XSTATS")),
                        "stats": {f: stats[f] for f in ("packets", "drop", "overlimits", "qlen", "backlog")}
                        if stats else {}})
    return out
