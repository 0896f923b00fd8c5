"""Sockets opened inside a named network namespace (`ip netns add NAME`), for a manager that stays in its own.

The UML lab's control network lives in the lab's namespace only: nothing of it exists in the root
namespace. A socket belongs to the namespace it was created in, whatever thread later uses it, so the
manager creates it in a short-lived thread that has joined that namespace (setns affects the calling
thread only) and then uses it from its own event loop. A fresh thread each time: a pooled worker would
stay in the other namespace for whatever it ran next.
"""
from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)   # os.setns is Python 3.12+
T = TypeVar("T")


def in_netns(netns: str, make: Callable[[], T]) -> T:
    """`make()` run inside network namespace `netns` (OSError if it does not exist), in a fresh thread that
    joined it, so the caller's own threads never leave theirs; what it makes (a socket, a tap's fd) keeps
    the namespace it was created in."""
    if "/" in netns or netns in ("", ".", ".."):
        raise ValueError(f"{netns!r} is not a network namespace name")
    made: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            made.append(make())
        except BaseException as exc:   # noqa: BLE001 - handed to the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=run, name=f"netns-{netns}", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return made[0]


def socket_in_netns(netns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A new, unconnected socket in network namespace `netns`."""
    return in_netns(netns, lambda: socket.socket(family, kind))


def connect_in_netns(netns: str, addr: str, port: int, timeout_s: float = 5.0) -> socket.socket:
    """A TCP connection to addr:port made from inside `netns` (blocking connect, bounded by timeout_s)."""
    sock = socket_in_netns(netns)
    try:
        sock.settimeout(timeout_s)
        sock.connect((addr, port))
    except BaseException:
        sock.close()
        raise
    return sock
