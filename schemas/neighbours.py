"""Static neighbours as both sides read them: the PERMANENT entries of literal `ip -j neigh show` output.

The agent snapshots and restores them; the manager checks that every peer the plan made `nud permanent`
(G-ARP) is there.
"""
from __future__ import annotations

from typing import Any


def permanent_neighbours(entries: list[dict[str, Any]]) -> dict[str, str]:
    """`ip -j neigh show` entries -> {address: lladdr (lower case)} of the PERMANENT ones."""
    return {e["dst"]: e.get("lladdr", "").lower() for e in entries
            if "PERMANENT" in e.get("state", []) and "lladdr" in e}
