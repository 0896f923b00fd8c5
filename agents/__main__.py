"""`python -m agents`: start one tcplab agent (runs as root on a testbed host or in a lab namespace)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from websockets.asyncio.server import serve, unix_serve

from agents.rootdir import ensure_artifacts_root
from agents.server import Agent, ensure_tracefs
from schemas import allowlist


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tcplab-agent", description=__doc__)
    p.add_argument("--name", required=True, help="role/host name used in logs")
    p.add_argument("--listen", required=True, help="unix:/path/agent.sock or tcp://HOST:PORT")
    p.add_argument("--token-file", required=True, type=Path, help="shared secret of the testbed")
    p.add_argument("--interface", action="append", default=[], help="allow-listed data interface")
    p.add_argument("--artifacts", type=Path, required=True, help="directory for run artifacts")
    p.add_argument("--allow-sysctl", action="append", default=[], metavar="PREFIX",
                   help="sysctl prefix a plan may write (repeatable; `{interface}` stands for each --interface; "
                   f"`{allowlist.DEFAULTS}` adds the defaults; none given: the defaults, "
                   f"{' '.join(allowlist.DEFAULT_SYSCTL_PREFIXES)})")
    p.add_argument("--allow-module", action="append", default=[], metavar="NAME",
                   help="kernel module a plan may load and set parameters of (repeatable; "
                   f"`{allowlist.DEFAULTS}` adds the defaults; none given: the defaults of schemas/allowlist.py)")
    args = p.parse_args(argv)
    try:   # checked here, so a typo stops the agent at start and not a run
        allowlist.sysctl_prefixes(args.allow_sysctl)
        allowlist.modules(args.allow_module)
    except allowlist.AllowListError as exc:
        p.error(str(exc))
    return args


async def serve_forever(args: argparse.Namespace) -> None:
    token = args.token_file.read_bytes().strip()
    artifacts = ensure_artifacts_root(args.artifacts)   # refuses a root another user could swap or write
    ensure_tracefs()
    # the capability probe blocks (tc, ethtool, netlink through pyroute2, whose sync sockets run their own
    # event loop): off this one
    agent = await asyncio.to_thread(Agent, args.name, token, args.interface, artifacts,
                                    args.allow_sysctl, args.allow_module)
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    limits = {"max_size": 8 * 1024 * 1024, "ping_interval": 20, "ping_timeout": 60}
    if args.listen.startswith("unix:"):
        path = args.listen.removeprefix("unix:")
        if os.path.exists(path):
            os.unlink(path)
        server = await unix_serve(agent.handle, path, **limits)
        os.chmod(path, 0o600)
    elif args.listen.startswith("tcp://"):
        host, _, port = args.listen.removeprefix("tcp://").rpartition(":")
        server = await serve(agent.handle, host, int(port), **limits)
    else:
        raise SystemExit(f"--listen: expected unix:/path or tcp://HOST:PORT, got {args.listen!r}")
    logging.getLogger("tcplab.agent").info("listening host=%s on=%s interfaces=%s", args.name,
                                           args.listen, ",".join(args.interface))
    async with server:
        await stop
        await agent.shutdown()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve_forever(parse_args(argv)))


if __name__ == "__main__":
    main()
