"""The qdisc kinds tcplab can put in a chain: one module per kind (or family), one registry.

`KINDS` maps a kind's name to its `QdiscKind` (base.py): typed stage, tc argv, expected read-back, buffer
in packets, leaf-only, capability probe. `QdiscStage`, the tagged union the `apply` contract carries, is
built from the same list, so a stage kind without a registry entry cannot exist. The manager (read-back,
guards, plan defaults) and the agent (argv, probe) both read this package; neither keeps a per-kind branch.

Adding a kind: see docs/host-state.md ("Qdisc kinds").
"""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field

from schemas.qdiscs.base import Expect, QdiscKind, Strict, tc_time
from schemas.qdiscs.cake import CAKE, Cake
from schemas.qdiscs.codel import CODEL, FQ_CODEL, Codel, FqCodel
from schemas.qdiscs.dualpi2 import DUALPI2, DualPi2
from schemas.qdiscs.fifo import BFIFO, PFIFO, Bfifo, Pfifo
from schemas.qdiscs.fq import FQ, Fq
from schemas.qdiscs.htb import HTB, Htb
from schemas.qdiscs.mark import MARK, Mark
from schemas.qdiscs.netem import NETEM, Netem
from schemas.qdiscs.pie import FQ_PIE, PIE, FqPie, Pie
from schemas.qdiscs.red import RED, Red
from schemas.qdiscs.tbf import TBF, Tbf

# the order is the union's order (and so the JSON Schema's): keep new kinds at the end
_ALL: tuple[QdiscKind[Any], ...] = (HTB, TBF, PFIFO, BFIFO, NETEM, RED, FQ_CODEL, CODEL, PIE, FQ_PIE, CAKE,
                                    DUALPI2, FQ, MARK)

KINDS: dict[str, QdiscKind[Any]] = {k.name: k for k in _ALL}

QdiscStage = Annotated[Union[tuple(k.stage for k in _ALL)], Field(discriminator="kind")]  # noqa: UP007


def kind_of(stage: Strict) -> QdiscKind[Any]:
    """The registry entry of a stage."""
    return KINDS[stage.kind]  # type: ignore[attr-defined]


def decoded_xstats(tc_kind: str | None, raw: object) -> dict | None:
    """TCA_XSTATS of one of tcplab's own kinds (pyroute2 shows them as hex), decoded; None for other kinds."""
    from schemas.rawqdisc import hex_bytes
    decode = next((k.xstats for k in _ALL if k.xstats is not None and k.tc_kind == tc_kind), None)
    return decode(bytes.fromhex(hex_bytes(raw))) if decode is not None and raw else None


def option_differences(stage: Strict, shown: dict) -> list[str]:
    """Every option of `stage` that `shown` (the qdisc's `tc -s -d -j` object, its class under "class")
    does not show as wanted, each as "<option> <got> != <want>"."""
    kind = kind_of(stage)
    if kind.expected is None:
        return [f"no read-back check for qdisc {kind.name}: {kind.pending}"]
    return [d for e in kind.expected(stage) if (d := e.difference(shown)) is not None]


__all__ = ["KINDS", "Bfifo", "Cake", "Codel", "DualPi2", "Expect", "Fq", "FqCodel", "FqPie", "Htb", "Mark",
           "Netem", "Pfifo", "Pie", "QdiscKind", "QdiscStage", "Red", "Tbf", "decoded_xstats", "kind_of",
           "option_differences", "tc_time"]
