"""Lab integration fixtures: real namespaces, real agents over real WebSockets, real tools.

Tests here need root and `ip netns`; without them they skip and say which of the two is missing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.inventory import Inventory, load_inventory
from orchestrator.lab import netns

TEST_PREFIX = os.environ.get("TCPLAB_TEST_PREFIX", "tcplabtest")  # parallel sessions need their own


def lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "lab tests need root (network namespaces, tc, tcpdump)"
    for tool in ("ip", "tc", "iperf3", "tcpdump", "ethtool"):
        if shutil.which(tool) is None:
            return f"lab tests need {tool} on PATH"
    probe = subprocess.run(["ip", "netns", "add", f"{TEST_PREFIX}-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces unavailable: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"{TEST_PREFIX}-probe"], check=False)
    return None


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[tuple[Inventory, Path]]:
    """A lab of our own (prefix tcplabtest, own state dir), torn down even when tests fail."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("labstate")
    try:
        netns.up(state_dir, TEST_PREFIX)
        yield load_inventory(netns.inventory_path(state_dir)), state_dir
    finally:
        netns.down(state_dir, TEST_PREFIX)
