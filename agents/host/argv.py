"""Pure argv builders for tc and ethtool: desired state in kernel units -> command lines.

Chain layout: stage i gets handle `i+1:`; stage i>0 hangs below `i:1` (htb's default class, or the
single inner class of netem/tbf). Classless leaf qdiscs (pfifo, bfifo) must come last.
"""
from __future__ import annotations

from schemas.hoststate import CLASSFUL_KINDS, Bfifo, Htb, Pfifo, QdiscStage, Tbf

# ethtool -K short name -> the long name `ethtool -k` / `--json -k` reports
OFFLOAD_LONG_NAMES = {
    "tso": "tcp-segmentation-offload",
    "gso": "generic-segmentation-offload",
    "gro": "generic-receive-offload",
    "lro": "large-receive-offload",
    "sg": "scatter-gather",
    "tx": "tx-checksumming",
    "rx": "rx-checksumming",
    "rxvlan": "rx-vlan-offload",
    "txvlan": "tx-vlan-offload",
    "rxhash": "receive-hashing",
    "ntuple": "ntuple-filters",
    "tx-gso-partial": "tx-gso-partial",
    "rx-gro-list": "rx-gro-list",
    "rx-udp-gro-forwarding": "rx-udp-gro-forwarding",
}

LEAF_ONLY = frozenset({"pfifo", "bfifo"})


class ChainError(ValueError):
    pass


def stage_params(stage: QdiscStage) -> list[str]:
    if isinstance(stage, Htb):
        return ["htb", "default", "1"]
    if isinstance(stage, Tbf):
        return ["tbf", "rate", f"{stage.rate_bit}bit", "burst", str(stage.burst_bytes),
                "limit", str(stage.limit_bytes)]
    if isinstance(stage, Pfifo):
        return ["pfifo", "limit", str(stage.limit_packets)]
    if isinstance(stage, Bfifo):
        return ["bfifo", "limit", str(stage.limit_bytes)]
    raise ChainError(f"no argv builder for qdisc {stage.kind!r}")


def htb_class_argv(dev: str, handle_major: int, stage: Htb) -> list[str]:
    argv = ["tc", "class", "add", "dev", dev, "parent", f"{handle_major}:", "classid", f"{handle_major}:1",
            "htb", "rate", f"{stage.rate_bit}bit", "ceil", f"{stage.ceil_bit or stage.rate_bit}bit"]
    if stage.burst_bytes:
        argv += ["burst", str(stage.burst_bytes)]
    if stage.cburst_bytes or stage.burst_bytes:
        argv += ["cburst", str(stage.cburst_bytes or stage.burst_bytes)]
    if stage.quantum_bytes:
        argv += ["quantum", str(stage.quantum_bytes)]
    return argv


def chain_argv(dev: str, stages: list[QdiscStage]) -> list[list[str]]:
    """Commands that build `stages` on `dev`, assuming its root was reset to the default first."""
    for i, stage in enumerate(stages[:-1]):
        if stage.kind in LEAF_ONLY:
            raise ChainError(f"stage {i} ({stage.kind}) cannot have a child qdisc; put it last")
    cmds: list[list[str]] = []
    for i, stage in enumerate(stages):
        where = ["root"] if i == 0 else ["parent", f"{i}:1"]
        cmds.append(["tc", "qdisc", "add", "dev", dev, *where, "handle", f"{i + 1}:", *stage_params(stage)])
        if stage.kind in CLASSFUL_KINDS:
            assert isinstance(stage, Htb)
            cmds.append(htb_class_argv(dev, i + 1, stage))
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
