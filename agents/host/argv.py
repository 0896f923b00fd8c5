"""Pure argv builders for tc and ethtool: desired state in kernel units -> command lines.

Chain layout: stage i gets handle `i+1:`; stage i>0 hangs below `i:1` (htb's default class, or the
single inner class of netem/tbf). A leaf-only kind (FIFOs, RED, every AQM) must come last. Each stage's
tc parameters, and whether it is a leaf, come from its kind in `schemas/qdiscs/`.
"""
from __future__ import annotations

from dataclasses import dataclass

from schemas.nic import OFFLOAD_LONG_NAMES
from schemas.qdiscs import QdiscStage, kind_of
from schemas.rawqdisc import handle_text


class ChainError(ValueError):
    pass


tc_handle = handle_text   # a netlink 32-bit handle as tc prints it: "1:", "1:1", "root"


@dataclass(frozen=True)
class RawQdisc:
    """A qdisc stock tc cannot configure (aqm_mark of tcplab's own modules; dualpi2, which iproute2 knows only
    from 6.17 on): an RTM_NEWQDISC with these raw
    TCA_OPTIONS bytes (schemas/rawqdisc.configure); `nested`: with NLA_F_NESTED on the nest (the kind's
    `netlink_nested`)."""

    dev: str
    parent: str
    handle: str
    kind: str
    options: bytes
    nested: bool = False


def stage_params(stage: QdiscStage) -> list[str]:
    """tc parameters of one stage, from its kind's builder (schemas/qdiscs/)."""
    kind = kind_of(stage)
    if kind.params is None:
        raise ChainError(f"no argv builder for qdisc {kind.name!r} in stock iproute2: {kind.pending}")
    return kind.params(stage)


def chain_argv(dev: str, stages: list[QdiscStage]) -> list[list[str] | RawQdisc]:
    """Commands that build `stages` on `dev`, assuming its root was reset to the default first: tc argv, or a
    RawQdisc for a kind tc cannot configure."""
    for i, stage in enumerate(stages[:-1]):
        if kind_of(stage).leaf_only:
            raise ChainError(f"stage {i} ({stage.kind}) cannot have a child qdisc; put it last")
    cmds: list[list[str] | RawQdisc] = []
    for i, stage in enumerate(stages):
        where = ["root"] if i == 0 else ["parent", f"{i}:1"]
        kind = kind_of(stage)
        if kind.netlink is not None:
            cmds.append(RawQdisc(dev, where[-1], f"{i + 1}:", kind.tc_kind, kind.netlink(stage), kind.netlink_nested))
            continue
        cmds.append(["tc", "qdisc", "add", "dev", dev, *where, "handle", f"{i + 1}:", *stage_params(stage)])
        class_params = kind_of(stage).class_params
        if class_params is not None:
            cmds.append(["tc", "class", "add", "dev", dev, "parent", f"{i + 1}:", "classid", f"{i + 1}:1",
                         *class_params(stage)])
    return cmds


def root_delete_argv(dev: str) -> list[str]:
    return ["tc", "qdisc", "del", "dev", dev, "root"]


def offload_argv(dev: str, changes: dict[str, bool]) -> list[str]:
    argv = ["ethtool", "-K", dev]
    for name, on in sorted(changes.items()):
        if name not in OFFLOAD_LONG_NAMES:
            raise ChainError(f"unknown offload feature {name!r}")
        argv += [name, "on" if on else "off"]
    return argv


def readback_argv(dev: str) -> dict[str, list[str]]:
    return {
        "tc_qdisc": ["tc", "-s", "-d", "-j", "qdisc", "show", "dev", dev],
        "tc_class_text": ["tc", "-s", "-d", "class", "show", "dev", dev],
        "features": ["ethtool", "--json", "-k", dev],
    }
