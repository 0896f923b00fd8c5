"""Benchmark: install + reboot + verify of a Debian kernel package on a TCG disk guest (target: < 60 s).

Usage: .venv/bin/python bench/kernel_install.py [PACKAGE ...]
(default: linux-image-6.12.*+deb12-amd64 linux-image-6.12.*+deb12-cloud-amd64)
Brings up a VM lab with the aqm as a disk guest (own state dir and prefix), provisions it (site.yml), then
times `kernel-install.yml` for each PACKAGE in turn and prints each step: the copy and install of the package,
the reboot (through the lab's firmware and the guest's one-shot boot entry), the verification, and the whole,
as a ratio of the guest's own cold boot measured in the same run (QEMU start to sshd) -- the floor any reboot
pays. A second install of the same kernel (no reboot) is timed too. Takes the lab down at the end.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from orchestrator.ansible import kernel_install
from orchestrator.ansible.provision import provision
from orchestrator.lab import vm

PREFIX = "tcplabbki"


def main(argv: list[str]) -> None:
    packages = argv or ["linux-image-6.12.*+deb12-amd64", "linux-image-6.12.*+deb12-cloud-amd64"]
    console = Console(stderr=True)
    targets = [kernel_install.resolve(p) for p in packages]   # downloads the .debs first: not part of the timing
    state_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    try:
        inv = vm.up(state_dir, PREFIX, timeout_s=300, disk=True)
        cold_boot_s = inv["vm"]["guests"]["aqm"]["ssh_s"]
        prov = provision(state_dir / "inventory.ini", console)
        if not prov.ok:
            sys.exit(f"provision failed: {prov.failed}")
        for target in targets:
            measure(state_dir, target, cold_boot_s, console)
    finally:
        vm.down(state_dir, PREFIX)


def measure(state_dir: Path, target: kernel_install.KernelTarget, cold_boot_s: float, console: Console) -> None:
    size_mb = sum(p.stat().st_size for p in target.packages) / 1e6
    t = time.perf_counter()
    result = kernel_install.install(state_dir / "inventory.ini", target, ["aqm"], console,
                                    modules=["sch_netem"], ccs=["dctcp"], qdiscs=["netem", "fq_codel"])
    total_s = time.perf_counter() - t
    if not result.ok:
        sys.exit(f"kernel install failed: {result.failed}")
    steps = dict(next(iter(result.task_s.values())))
    t = time.perf_counter()
    again = kernel_install.install(state_dir / "inventory.ini", target, ["aqm"], console, qdiscs=["netem"])
    again_s = time.perf_counter() - t
    copy_s = sum(v for k, v in steps.items() if k.startswith("the kernel packages on the host"))
    dpkg_s = sum(v for k, v in steps.items() if k.startswith("the kernel packages installed"))
    reboot_s = steps.get("reboot into it", 0.0)
    verify_s = sum(v for k, v in steps.items() if k.startswith("verify"))
    rest_s = total_s - copy_s - dpkg_s - reboot_s - verify_s
    print(f"kernel install {target.release} ({size_mb:.0f} MB) on a TCG disk guest: total {total_s:.1f} s "
          f"(target < 60 s: {'met' if total_s < 60 else 'NOT met'}); copy {copy_s:.1f} s, dpkg {dpkg_s:.1f} s, "
          f"reboot {reboot_s:.1f} s, verify {verify_s:.1f} s, the rest {rest_s:.1f} s; "
          f"the guest's cold boot {cold_boot_s:.1f} s -> total = {total_s / cold_boot_s:.1f}x a cold boot, "
          f"reboot = {reboot_s / cold_boot_s:.1f}x")
    print(f"  second install (already on it, no reboot): {again_s:.1f} s, {again.changes} changes")
    print("  per task (s): " + ", ".join(f"{k}={v}" for k, v in steps.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
