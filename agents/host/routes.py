"""`quickack` on the routes of a data interface (the ack_policy mechanism quickack_route, G-ACK).

A TCP socket whose route carries the RTAX_QUICKACK metric acknowledges every segment at once (the kernel's
tcp_in_quickack_mode). `ip route change` replaces the route whole, metrics included, so a route is rewritten
only when every attribute it has can be stated again exactly: its destination, gateway, protocol, scope,
preferred source, metric and IPv6 preference. A route with other metrics (mtu, rto_min, ...: `ip -j` does not
print their `lock`), several next hops or encapsulation is refused, never rewritten with less than it had.

The argv builders and `quickack_changes` are pure; `read_routes` and `set_quickack` are the effects.
"""
from __future__ import annotations

import json
from typing import Any

from agents.host.errors import StateError
from schemas import procs
from schemas.routes import route_key, route_quickack

FAMILIES = {"inet": "-4", "inet6": "-6"}
# attributes `ip route change` is given back as they were (ip -j name -> ip route keyword; None: the value
# itself, e.g. the destination)
REBUILT = {"dst": None, "gateway": "via", "protocol": "proto", "scope": "scope", "prefsrc": "src",
           "metric": "metric", "pref": "pref"}
IGNORED = {"dev", "flags", "metrics", "type"}   # the interface is given; flags and type are checked below
MAX_ROUTES_PER_INTERFACE = 256                  # a data interface of a testbed host has a handful


class RouteError(StateError):
    """A route this agent cannot rewrite without losing part of it."""


def show_argv(dev: str, family: str) -> list[str]:
    return ["ip", "-j", FAMILIES[family], "route", "show", "dev", dev]


def parse_routes(text: str) -> list[dict[str, Any]]:
    routes = json.loads(text or "[]")
    if not isinstance(routes, list) or not all(isinstance(r, dict) for r in routes):
        raise ValueError(f"`ip -j route show` printed no list of routes: {text[:200]!r}")
    return routes


def change_argv(dev: str, family: str, route: dict[str, Any], quickack: bool) -> list[str]:
    """`ip route change` restating `route` on `dev` with quickack on or off (`quickack 0` removes the metric)."""
    where = f"{dev} route {route_key(family, route)}"
    unknown = sorted(set(route) - set(REBUILT) - IGNORED)
    if unknown:
        raise RouteError(f"{where}: cannot restate its {', '.join(unknown)} with `ip route change`")
    if route.get("type", "unicast") != "unicast":
        raise RouteError(f"{where}: a {route['type']} route, not a unicast one")
    others = sorted({k for m in route.get("metrics", []) for k in m} - {"quickack"})
    if others:
        raise RouteError(f"{where}: has metrics {', '.join(others)}, which `ip -j` prints without their lock")
    flags = set(route.get("flags", [])) - {"linkdown"}
    if flags - {"onlink"}:
        raise RouteError(f"{where}: flags {', '.join(sorted(flags))}")
    argv = ["ip", FAMILIES[family], "route", "change", str(route["dst"])]
    for key, keyword in REBUILT.items():
        if key != "dst" and key in route:
            argv += [keyword, str(route[key])]
    argv += ["dev", dev, *(["onlink"] if "onlink" in flags else []), "quickack", "1" if quickack else "0"]
    return argv


def quickack_changes(dev: str, routes: dict[str, list[dict[str, Any]]],
                     want: dict[str, bool] | bool) -> list[list[str]]:
    """The argv that make each route's quickack what `want` says: one value for every route, or per route key
    (keys not named: off). Routes already so are left alone; all are checked before any is returned."""
    argv = []
    for family, rs in routes.items():
        if len(rs) > MAX_ROUTES_PER_INTERFACE:
            raise RouteError(f"{dev}: {len(rs)} {family} routes, over {MAX_ROUTES_PER_INTERFACE}")
        for r in rs:
            on = want if isinstance(want, bool) else want.get(route_key(family, r), False)
            if route_quickack(r) != on:
                argv.append(change_argv(dev, family, r, on))
    return argv


def read_routes(dev: str) -> dict[str, list[dict[str, Any]]]:
    """family -> the interface's routes in the main table, as `ip -j` prints them."""
    out = {}
    for family in FAMILIES:
        done = procs.run(show_argv(dev, family), check=False)
        if done.returncode != 0:   # e.g. IPv6 disabled: that family has no routes
            out[family] = []
            continue
        out[family] = parse_routes(done.stdout)
    return out


def set_quickack(dev: str, want: dict[str, bool] | bool) -> None:
    for argv in quickack_changes(dev, read_routes(dev), want):
        try:
            procs.run(argv)
        except procs.CommandFailed as exc:
            raise StateError(str(exc), field=f"state.interfaces.{dev}.quickack") from exc
