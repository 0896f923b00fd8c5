"""`tcplab serve [--db URL] [--host 127.0.0.1] [--port 8000]`: the read-only web page (docs/web.md)."""
from __future__ import annotations

import argparse

from rich.console import Console


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    import uvicorn

    from orchestrator.web.app import create_app
    from orchestrator.web.db import ReadOnlyDbError, open_readonly

    try:
        engine = open_readonly(args.db)
    except ReadOnlyDbError as exc:
        console.print(f"tcplab serve: {exc}", markup=False)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"tcplab serve: listening on {args.host}: anyone who reaches it reads every run "
                      "(there is no login)", markup=False)
    console.print(f"tcplab serve: http://{args.host}:{args.port}/ (read-only)", markup=False)
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level=args.log_level,
                proxy_headers=False, server_header=False)
    return 0


def tcp_port(text: str) -> int:
    """argparse type: a TCP port number (a bad one is a usage error, not a traceback from the server)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return port


def add_parser(sub, console: Console) -> None:
    p = sub.add_parser("serve", help="a read-only web page over the result database: runs, plots, plans, "
                       "campaigns, comparisons (docs/web.md)")
    p.add_argument("--db", default=None, help="database URL (default $TCPLAB_DB or results/tcplab.db)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: local only)")
    p.add_argument("--port", type=tcp_port, default=8000, help="TCP port, 1-65535 (default 8000)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=lambda args: cmd_serve(args, console))
