"""Routes as `ip -j route show dev IF` prints them, read by the agent and the manager alike: which route it
is and whether it carries `quickack` (the ack_policy mechanism quickack_route, G-ACK)."""
from __future__ import annotations

from typing import Any


def route_quickack(route: dict[str, Any]) -> bool:
    """`quickack 1` among the route's metrics (ip prints them as a list of one-key objects; `quickack 0`
    removes the metric)."""
    return any(bool(m.get("quickack")) for m in route.get("metrics", []) if isinstance(m, dict))


def route_key(family: str, route: dict[str, Any]) -> str:
    """What names a route of one interface's main table: family, destination and metric (the kernel's key
    with the default TOS), e.g. `inet 10.0.1.0/24` or `inet6 fd00::/64 metric 256`."""
    metric = route.get("metric")
    return f"{family} {route.get('dst')}" + (f" metric {metric}" if metric is not None else "")


def quickack_by_route(routes: dict[str, list[dict[str, Any]]]) -> dict[str, bool]:
    """family -> routes (the literal output per family) as route key -> quickack."""
    return {route_key(family, r): route_quickack(r) for family, rs in routes.items() for r in rs}
