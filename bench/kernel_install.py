"""Benchmark: install + reboot + verify of a Debian kernel package on a TCG disk guest (target: < 60 s).

Usage: .venv/bin/python bench/kernel_install.py [PACKAGE]   (default linux-image-6.12.*+deb12-amd64)
Brings up a VM lab with the aqm as a disk guest (own state dir and prefix), provisions it (site.yml), then
times `kernel-install.yml` for PACKAGE and prints each step: the copy and install of the package, the reboot
(through the lab's firmware and the guest's one-shot boot entry), the verification, and the whole, as a ratio
of the guest's own cold boot measured in the same run (QEMU start to sshd) -- the floor any reboot pays.
A second install of the same kernel (no reboot) is timed too. Takes the lab down at the end.
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
    package = argv[0] if argv else "linux-image-6.12.*+deb12-amd64"
    console = Console(stderr=True)
    target = kernel_install.resolve(package)           # downloads the .deb first: not part of the timing
    state_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    try:
        inv = vm.up(state_dir, PREFIX, timeout_s=300, disk=True)
        cold_boot_s = inv["vm"]["guests"]["aqm"]["ssh_s"]
        prov = provision(state_dir / "inventory.ini", console)
        if not prov.ok:
            sys.exit(f"provision failed: {prov.failed}")
        t = time.perf_counter()
        result = kernel_install.install(state_dir / "inventory.ini", target, ["aqm"], console,
                                        modules=["sch_netem"], ccs=["dctcp"], qdiscs=["netem", "fq_codel"])
        total_s = time.perf_counter() - t
        if not result.ok:
            sys.exit(f"kernel install failed: {result.failed}")
        steps = dict(result.task_s["tcplabbki-aqm"])
        t = time.perf_counter()
        again = kernel_install.install(state_dir / "inventory.ini", target, ["aqm"], console, qdiscs=["netem"])
        again_s = time.perf_counter() - t
        install_s = sum(v for k, v in steps.items() if "packages" in k or "cache directory" in k)
        verify_s = sum(v for k, v in steps.items() if k.startswith(("the modules", "the congestion", "each qdisc",
                                                                    "the host runs", "the kernel and boot after")))
        print(f"kernel install {target.release} on a TCG disk guest: total {total_s:.1f} s "
              f"(target < 60 s: {'met' if total_s < 60 else 'NOT met'}); copy+install {install_s:.1f} s, "
              f"reboot {steps.get('reboot into it', 0):.1f} s, verify {verify_s:.1f} s; "
              f"the guest's cold boot {cold_boot_s:.1f} s -> total = {total_s / cold_boot_s:.1f}x a cold boot, "
              f"reboot = {steps.get('reboot into it', 0) / cold_boot_s:.1f}x")
        print(f"second install (already on it, no reboot): {again_s:.1f} s, {again.changes} changes")
        print("per task (s): " + ", ".join(f"{k}={v}" for k, v in steps.items()))
    finally:
        vm.down(state_dir, PREFIX)


if __name__ == "__main__":
    main(sys.argv[1:])
