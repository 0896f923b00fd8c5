"""Pure argv for static neighbours (`ip neigh`): list, make permanent, delete.

Which entries count as static is part of the contract (`schemas.neighbours.permanent_neighbours`).
"""
from __future__ import annotations


def show_argv(dev: str) -> list[str]:
    return ["ip", "-j", "neigh", "show", "dev", dev]


def replace_argv(dev: str, addr: str, lladdr: str) -> list[str]:
    return ["ip", "neigh", "replace", addr, "lladdr", lladdr, "dev", dev, "nud", "permanent"]


def delete_argv(dev: str, addr: str) -> list[str]:
    return ["ip", "neigh", "del", addr, "dev", dev]
