"""The error an agent raises when it cannot bring the host into the asked state; `field` names the request
field at fault (e.g. `state.sysctls.net.ipv4.tcp_ecn`), so the manager can point at it. `NotAllowed` is a request
the agent refuses outright (off its allow-lists), before it changes anything: the reply's code is `refused`."""
from __future__ import annotations


class StateError(Exception):
    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class NotAllowed(StateError):
    pass
