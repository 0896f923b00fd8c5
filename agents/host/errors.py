"""The error an agent raises when it cannot bring the host into the asked state; `field` names the request
field at fault (e.g. `state.sysctls.net.ipv4.tcp_ecn`), so the manager can point at it."""
from __future__ import annotations


class StateError(Exception):
    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field
