"""`python -m agents`: start one tcplab agent (runs as root on a testbed host or in a lab namespace)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
from pathlib import Path

from websockets.asyncio.server import serve, unix_serve

from agents.admission import PreAuthLimits
from agents.connections import BoundedLogFilter, gated_connection_factory
from agents.host.capabilities import set_instance_prefix
from agents.rootdir import ensure_artifacts_root
from agents.server import Agent, ensure_tracefs
from schemas import allowlist
from schemas.handshake import certificate_binding


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tcplab-agent", description=__doc__)
    p.add_argument("--name", required=True, help="role/host name used in logs")
    p.add_argument("--listen", required=True, help="unix:/path/agent.sock or tcp://HOST:PORT")
    p.add_argument("--token-file", required=True, type=Path, help="shared secret of the testbed")
    p.add_argument("--interface", action="append", default=[], help="allow-listed data interface")
    p.add_argument("--artifacts", type=Path, required=True, help="directory for run artifacts")
    p.add_argument("--new-host", action="store_true",
                   help="the host was just created (a lab namespace): drop a reset baseline a crashed agent of an "
                        "earlier host of this name left, instead of restoring it")
    p.add_argument("--allow-sysctl", action="append", default=[], metavar="PREFIX",
                   help="sysctl prefix a plan may write (repeatable; `{interface}` stands for each --interface; "
                   f"`{allowlist.DEFAULTS}` adds the defaults; none given: the defaults, "
                   f"{' '.join(allowlist.DEFAULT_SYSCTL_PREFIXES)})")
    p.add_argument("--allow-module", action="append", default=[], metavar="NAME",
                   help="kernel module a plan may load and set parameters of (repeatable; "
                   f"`{allowlist.DEFAULTS}` adds the defaults; none given: the defaults of schemas/allowlist.py)")
    p.add_argument("--module-dir", action="append", default=[], type=Path, metavar="DIR",
                   help="directory of module files (<name>.ko) the agent may insmod for a plan (repeatable); only "
                   "allow-listed names are loaded, anything else by modprobe")
    p.add_argument("--trace-prefix", default="tcplab", metavar="PREFIX",
                   help="first word of the tracefs instances this agent creates: a lab's prefix, so that its "
                   "`lab down` removes them and no other lab's (letters and digits)")
    p.add_argument("--tls-cert", type=Path, help="PEM certificate (chain) of this agent: TLS on tcp://")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", type=Path,
                   help="PEM CA bundle: only managers with a client certificate it signed may connect")
    args = p.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        p.error("--tls-client-ca needs --tls-cert and --tls-key")
    if args.tls_cert and not args.listen.startswith("tcp://"):
        p.error("TLS is for --listen tcp://HOST:PORT (a UNIX socket is protected by its file mode)")
    try:   # checked here, so a typo stops the agent at start and not a run
        allowlist.sysctl_prefixes(args.allow_sysctl)
        allowlist.modules(args.allow_module)
        set_instance_prefix(args.trace_prefix)
    except (allowlist.AllowListError, ValueError) as exc:
        p.error(str(exc))
    return args


def read_token(path: Path) -> bytes:
    """The shared token; an agent with an empty one would close every connection, so it does not start."""
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise SystemExit(f"--token-file {path}: cannot read the shared token: {exc.strerror}") from None
    if not token:
        raise SystemExit(f"--token-file {path}: the file is empty; the agent will not start without a shared token")
    return token


def tls_context(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, str]:
    """(server context, channel binding: sha256 of our certificate) -- (None, "") without TLS."""
    if args.tls_cert is None:
        return None, ""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(args.tls_cert, args.tls_key)
    if args.tls_client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=args.tls_client_ca)
    leaf_pem = args.tls_cert.read_text()
    end = "-----END CERTIFICATE-----"
    leaf_der = ssl.PEM_cert_to_DER_cert(leaf_pem[:leaf_pem.index(end) + len(end)])
    return ctx, certificate_binding(leaf_der)


async def serve_forever(args: argparse.Namespace) -> None:
    token = read_token(args.token_file)
    tls, binding = tls_context(args)
    artifacts = ensure_artifacts_root(args.artifacts)   # refuses a root another user could swap or write
    ensure_tracefs()
    limits = PreAuthLimits()
    # the capability probe blocks (tc, ethtool, netlink through pyroute2, whose sync sockets run their own
    # event loop): off this one
    agent = await asyncio.to_thread(Agent, args.name, token, args.interface, artifacts,
                                    args.allow_sysctl, args.allow_module, binding, limits, args.new_host,
                                    args.module_dir)
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    # frames up to 64 KiB before hello (raised to 8 MiB per connection after it); every socket counts against
    # the cap from accept on (TLS is negotiated by the gated connection, after admission); a peer that does not
    # finish the TLS handshake in 5 s, or the WebSocket handshake in open_timeout, is dropped
    ws_log = logging.getLogger("tcplab.agent.websockets")
    ws_log.addFilter(BoundedLogFilter())
    ws_log.setLevel(logging.WARNING)   # no line per connection opened or closed: the agent logs what matters
    # keepalive: a manager whose host died without closing is gone (and its run takeable) within 5 + 15 s
    # no permessage-deflate: captures do not compress well and deflate (~36 MB/s) made collect slower than the link
    options = {"max_size": limits.max_frame_before_hello, "ping_interval": 5, "ping_timeout": 15,
               "open_timeout": 5, "close_timeout": 5, "logger": ws_log, "compression": None,
               "create_connection": gated_connection_factory(agent.admission, agent.audit, tls=tls)}
    if args.listen.startswith("unix:"):
        path = args.listen.removeprefix("unix:")
        if os.path.exists(path):
            os.unlink(path)
        server = await unix_serve(agent.handle, path, **options)
        os.chmod(path, 0o600)
    elif args.listen.startswith("tcp://"):
        host, _, port = args.listen.removeprefix("tcp://").rpartition(":")
        server = await serve(agent.handle, host, int(port), **options)   # TLS: in the gated connection
    else:
        raise SystemExit(f"--listen: expected unix:/path or tcp://HOST:PORT, got {args.listen!r}")
    logging.getLogger("tcplab.agent").info("listening host=%s on=%s tls=%s interfaces=%s", args.name,
                                           args.listen, "yes" if tls else "no", ",".join(args.interface))
    async with server:
        await stop
        await agent.shutdown()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve_forever(parse_args(argv)))


if __name__ == "__main__":
    main()
