"""pfifo and bfifo: tail-drop FIFOs limited in packets or in bytes."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import Expect, QdiscKind, Strict, bytes_in_packets


class Pfifo(Strict):
    kind: Literal["pfifo"] = "pfifo"
    limit_packets: int = Field(gt=0)


class Bfifo(Strict):
    kind: Literal["bfifo"] = "bfifo"
    limit_bytes: int = Field(gt=0)


PFIFO = QdiscKind(
    stage=Pfifo,
    params=lambda s: ["pfifo", "limit", str(s.limit_packets)],
    expected=lambda s: [Expect("limit", ("options", "limit"), s.limit_packets, ("limit_packets",), unit="packets")],
    buffer_packets=lambda s, mtu: s.limit_packets,
    probe=("pfifo", "limit", "10"),
    leaf_only=True,
)

BFIFO = QdiscKind(
    stage=Bfifo,
    params=lambda s: ["bfifo", "limit", str(s.limit_bytes)],
    expected=lambda s: [Expect("limit", ("options", "limit"), s.limit_bytes, ("limit_bytes",), unit="bytes")],
    buffer_packets=lambda s, mtu: bytes_in_packets(s.limit_bytes, mtu),
    probe=("bfifo", "limit", "10000"),
    leaf_only=True,
)
