"""Configure and read back DualPI2 over netlink with pyroute2 (iproute2 6.1's tc does not know it). Effects;
the bytes are schemas/qdiscs/dualpi2_netlink.py, the requests schemas/rawqdisc.py's. Runs where
sch_dualpi2 is loaded (a VM-lab guest on 7.2: `vm.guest_exec([python, "-m", "orchestrator.kernel.dualpi2_nl",
...])`):

    python -m orchestrator.kernel.dualpi2_nl add --dev to-client --parent 2:1 --handle 3: --target-us 15000
    python -m orchestrator.kernel.dualpi2_nl change --dev to-client --parent 2:1 --handle 3: --coupling 3
    python -m orchestrator.kernel.dualpi2_nl show --dev to-client    # JSON: options, xstats, mismatches
    python -m orchestrator.kernel.dualpi2_nl watch --dev to-client --every 0.1 --count 300   # JSON lines

add/change print the read-back with `mismatches` (what the kernel holds differently from what was sent;
empty when the read-back is what was asked). A plan's `dualpi2` stage goes the same way through the agent
(schemas/qdiscs/dualpi2.py: the same encoder, the same request, the same flag).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from schemas import rawqdisc
from schemas.qdiscs import dualpi2_netlink as dn
from schemas.qdiscs.dualpi2 import DUALPI2


def show(dev: str) -> list[dict]:
    """Every dualpi2 qdisc on `dev`: handle, parent, decoded options (and their bytes), xstats and the generic
    counters (`stats`: packets, drop, overlimits, qlen, backlog)."""
    out = []
    for q in rawqdisc.dump(dev, [dn.KIND]):
        options, xstats = bytes.fromhex(q["options_hex"]), bytes.fromhex(q["xstats_hex"])
        out.append({"handle": q["handle"], "parent": q["parent"], "options": dn.decode_options(options),
                    "options_hex": q["options_hex"], "xstats": dn.decode_xstats(xstats) if xstats else None,
                    "xstats_hex": q["xstats_hex"] or None, "stats": q["stats"]})
    return out


def apply(dev: str, parent: str, handle: str, values: dict[int, int], command: str = "add") -> list[dict]:
    """Send `values` (dualpi2_netlink attributes) and read back; each entry gets `mismatches`."""
    rawqdisc.configure(dev, parent, handle, dn.KIND, dn.encode(values), command, nested_flag=DUALPI2.netlink_nested)
    shown = show(dev)
    for q in shown:
        q["mismatches"] = dn.readback_mismatches(values, q["options"])
    return shown


def watch(dev: str, every_s: float, count: int) -> None:
    """`count` samples of the xstats, one JSON line each with the wall clock (the captures' clock)."""
    for _ in range(count):
        started = time.monotonic()
        for q in show(dev):
            print(json.dumps({"t": time.time(), "handle": q["handle"], "xstats": q["xstats"]}), flush=True)
        time.sleep(max(0.0, every_s - (time.monotonic() - started)))


def values_from_args(args: argparse.Namespace) -> dict[int, int]:
    pairs = {dn.LIMIT: args.limit, dn.TARGET: args.target_us, dn.TUPDATE: args.tupdate_us, dn.ALPHA: args.alpha,
             dn.BETA: args.beta, dn.STEP_THRESH_US: args.step_thresh_us, dn.COUPLING: args.coupling,
             dn.C_PROTECTION: args.c_protection,
             dn.ECN_MASK: dn.ECN_MASKS[args.ecn_mask] if args.ecn_mask else None}
    return {k: v for k, v in pairs.items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.kernel.dualpi2_nl")
    p.add_argument("command", choices=["add", "change", "show", "watch"])
    p.add_argument("--dev", required=True)
    p.add_argument("--parent", default="root")
    p.add_argument("--handle", default="0:")
    for name in ("limit", "target-us", "tupdate-us", "alpha", "beta", "step-thresh-us", "coupling", "c-protection"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--ecn-mask", choices=sorted(dn.ECN_MASKS))
    p.add_argument("--every", type=float, default=0.1, help="watch: seconds between samples")
    p.add_argument("--count", type=int, default=10, help="watch: samples")
    args = p.parse_args(argv)
    if args.command == "watch":
        watch(args.dev, args.every, args.count)
        return 0
    if args.command == "show":
        print(json.dumps(show(args.dev)))
        return 0
    shown = apply(args.dev, args.parent, args.handle, values_from_args(args), args.command)
    print(json.dumps(shown))
    return 1 if any(q["mismatches"] for q in shown) else 0


if __name__ == "__main__":
    sys.exit(main())
