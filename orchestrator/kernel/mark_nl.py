"""Configure and read back the `aqm_mark` qdisc by hand, over netlink (no patched tc). The bytes are
schemas/qdiscs/mark_netlink.py, the netlink requests schemas/rawqdisc.py (the agent's apply and read-back of a
plan's `mark` stage use the same two). Runs wherever the module is loaded (a VM-lab guest:
`vm.guest_exec([python, "-m", "orchestrator.kernel.mark_nl", ...])`):

    python -m orchestrator.kernel.mark_nl add --dev to-client --parent 2:1 --handle 3: --mode step --min-ns 2000000
    python -m orchestrator.kernel.mark_nl change --dev to-client --parent 2:1 --handle 3: --mode ramp ...
    python -m orchestrator.kernel.mark_nl show --dev to-client      # JSON: options and xstats of each aqm_mark
"""
from __future__ import annotations

import argparse
import json
import sys

from schemas import rawqdisc
from schemas.qdiscs import mark_netlink as mn


def show(dev: str) -> list[dict]:
    """Every aqm_mark qdisc on `dev` from a qdisc dump: handle, parent, decoded options and xstats."""
    out = []
    for q in rawqdisc.dump(dev, [mn.KIND]):
        options, xstats = bytes.fromhex(q["options_hex"]), bytes.fromhex(q["xstats_hex"])
        out.append({"handle": q["handle"], "parent": q["parent"], "options": mn.decode_options(options),
                    "options_hex": q["options_hex"], "xstats": mn.decode_xstats(xstats) if xstats else None})
    return out


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
        rawqdisc.configure(args.dev, args.parent, args.handle, mn.KIND, options, args.command)
    print(json.dumps(show(args.dev)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
