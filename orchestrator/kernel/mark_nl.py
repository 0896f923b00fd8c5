"""Configure and read back the `aqm_mark` qdisc over netlink with pyroute2 (no patched tc). Effects; the
bytes are schemas/qdiscs/mark_netlink.py. Runs wherever the module is loaded (a VM-lab guest:
`vm.guest_exec([python, "-m", "orchestrator.kernel.mark_nl", ...])`):

    python -m orchestrator.kernel.mark_nl add --dev to-client --parent 2:1 --handle 3: --mode step --min-ns 2000000
    python -m orchestrator.kernel.mark_nl change --dev to-client --parent 2:1 --handle 3: --mode ramp ...
    python -m orchestrator.kernel.mark_nl show --dev to-client      # JSON: options and xstats of each aqm_mark

The agent's apply path does not use it yet (a plan's `mark` stage is still refused as pending).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from schemas.qdiscs import mark_netlink as mn


async def _request(ipr, msg, msg_type: int, flags: int) -> list:
    return [x async for x in await ipr.nlm_request(msg, msg_type=msg_type, msg_flags=flags)]


async def configure(dev: str, parent: str, handle: str, options: bytes, command: str = "add",
                    kind: str = mn.KIND, nested_flag: bool = False) -> None:
    """RTM_NEWQDISC with TCA_KIND `kind` (aqm_mark; dualpi2_nl passes dualpi2) and the raw TCA_OPTIONS nest
    (add: create, fail if present; change: modify the existing one). `nested_flag`: set NLA_F_NESTED on
    TCA_OPTIONS, which a qdisc parsing it with nla_parse_nested (not _deprecated) requires (dualpi2: EINVAL
    without it)."""
    from pyroute2 import AsyncIPRoute
    from pyroute2.netlink import NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    async with AsyncIPRoute() as ipr:
        index = (await ipr.link_lookup(ifname=dev))[0]
        msg = tcmsg()
        msg["family"], msg["index"] = 0, index
        msg["handle"], msg["parent"] = mn.parse_handle(handle), mn.parse_handle(parent)
        msg["attrs"] = [("TCA_KIND", kind), ("TCA_OPTIONS", options, NLA_F_NESTED if nested_flag else 0)]
        flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if command == "add" else 0)
        await _request(ipr, msg, RTM_NEWQDISC, flags)


async def dump(dev: str, kind: str) -> list[tuple[str, str, bytes, bytes | None, dict]]:
    """(handle, parent, TCA_OPTIONS bytes, TCA_XSTATS bytes, TCA_STATS {packets, drop, overlimits, qlen,
    backlog}) of every `kind` qdisc on `dev` (a qdisc dump; pyroute2 knows neither kind and hands options and
    xstats over raw)."""
    from pyroute2 import AsyncIPRoute
    from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETQDISC
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    out = []
    async with AsyncIPRoute() as ipr:
        index = (await ipr.link_lookup(ifname=dev))[0]
        req = tcmsg()
        req["index"] = index
        for q in await _request(ipr, req, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP):
            if q["index"] != index or q.get_attr("TCA_KIND") != kind:
                continue
            xstats, stats = q.get_attr("TCA_XSTATS"), q.get_attr("TCA_STATS")
            counters = {f: stats[f] for f in ("packets", "drop", "overlimits", "qlen", "backlog")} if stats else {}
            out.append((f"{q['handle'] >> 16:x}:", f"{q['parent'] >> 16:x}:{q['parent'] & 0xFFFF:x}",
                        mn.from_hex(q.get_attr("TCA_OPTIONS") or b""), mn.from_hex(xstats) if xstats else None,
                        counters))
    return out


async def show(dev: str) -> list[dict]:
    """Every aqm_mark qdisc on `dev` from a qdisc dump: handle, parent, decoded options and xstats."""
    return [{"handle": handle, "parent": parent, "options": mn.decode_options(options), "options_hex": options.hex(),
             "xstats": mn.decode_xstats(xstats) if xstats else None}
            for handle, parent, options, xstats, _ in await dump(dev, mn.KIND)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.kernel.mark_nl")
    p.add_argument("command", choices=["add", "change", "show"])
    p.add_argument("--dev", required=True)
    p.add_argument("--parent", default="root")
    p.add_argument("--handle", default="0:")
    p.add_argument("--mode", choices=sorted(mn.MODES), default="step")
    p.add_argument("--metric", choices=sorted(mn.METRICS), default="sojourn")
    p.add_argument("--min-ns", type=int, default=1_000_000)
    p.add_argument("--max-ns", type=int)
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--on-enqueue", action="store_true", help="decide at enqueue instead of dequeue")
    p.add_argument("--rate", type=int, default=0, help="bytes/s for est (0: measured drain rate)")
    args = p.parse_args(argv)
    if args.command != "show":
        options = mn.encode_options(args.mode, args.metric, args.min_ns, args.max_ns, args.limit,
                                    not args.on_enqueue, args.rate)
        asyncio.run(configure(args.dev, args.parent, args.handle, options, args.command))
    print(json.dumps(asyncio.run(show(args.dev))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
