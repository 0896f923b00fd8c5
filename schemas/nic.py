"""NIC setting names both sides know: ethtool offload features, coalescing and pause-frame parameters.

The manager compares read-back with these names and the agent builds ethtool argv from them, so they live in
the contract, once. Offloads are asked for by the short names `ethtool -K` takes; `ethtool -k` (and
`--json -k`) reports the long names.
"""
from __future__ import annotations

# ethtool -K short name -> the long name `ethtool -k` / `--json -k` reports
OFFLOAD_LONG_NAMES: dict[str, str] = {
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

# `ethtool -C` parameter names (as `ethtool -c` prints them) that take an integer
COALESCE_INT_NAMES = frozenset({
    "rx-usecs", "rx-frames", "rx-usecs-irq", "rx-frames-irq", "tx-usecs", "tx-frames", "tx-usecs-irq",
    "tx-frames-irq", "stats-block-usecs", "sample-interval", "pkt-rate-low", "pkt-rate-high",
    "rx-usecs-low", "rx-frames-low", "tx-usecs-low", "tx-frames-low", "rx-usecs-high", "rx-frames-high",
    "tx-usecs-high", "tx-frames-high",
})
# on/off parameters: `ethtool -c` prints them as "Adaptive RX: on  TX: off" / "CQE mode RX: …  TX: …"
COALESCE_BOOL_NAMES = frozenset({"adaptive-rx", "adaptive-tx", "cqe-mode-rx", "cqe-mode-tx"})
COALESCE_NAMES = COALESCE_INT_NAMES | COALESCE_BOOL_NAMES

# `ethtool -A` pause-frame settings
PAUSE_NAMES = ("autoneg", "rx", "tx")
