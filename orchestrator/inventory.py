"""The testbed inventory the manager uses: roles -> agent endpoints and data interfaces.

The netns lab writes it (`/run/tcplab/inventory.json`); a physical testbed provides the same shape.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class InterfaceEntry(_Strict):
    toward: str
    addr: str
    plen: int
    peer_addr: str
    mac: str = ""


class HostEntry(_Strict):
    agent: str
    namespace: str | None = None
    interfaces: dict[str, InterfaceEntry]

    def iface_toward(self, role: str) -> str:
        for name, entry in self.interfaces.items():
            if entry.toward == role:
                return name
        raise KeyError(f"no interface toward {role!r} (have {sorted(self.interfaces)})")

    @property
    def data_addr(self) -> str:
        return next(iter(self.interfaces.values())).addr


class Inventory(_Strict):
    kind: str
    token_file: str
    hosts: dict[str, HostEntry]

    @property
    def token(self) -> bytes:
        return Path(self.token_file).read_bytes().strip()

    @property
    def tags(self) -> list[str]:
        # G-VM: runs on a virtual lab never feed baselines or study tables
        return ["smoke"] if self.kind in ("netns", "vm") else []


def load_inventory(path: Path) -> Inventory:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no inventory (is the lab up? run `tcplab lab up`)")
    return Inventory.model_validate(json.loads(path.read_text()))
