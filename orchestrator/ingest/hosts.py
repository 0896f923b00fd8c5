"""run_host rows (pure): per host of a run, the kernel the plan asked for and what the host reported.

The plan side is the RunSpec's kernel reference (variant, vanilla, the tcplab build key it expects); the host
side is the agent's hello as recorded in the run's evidence (release, boot_id, the build that
playbooks/kernel-install.yml recorded when it installed the running kernel, and the OS).
"""
from __future__ import annotations

from typing import Any

from orchestrator.plan import RunSpec


def host_rows(spec: RunSpec, evidence: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hello = {e["host"]: e["data"].get("capabilities", {}) for e in evidence if e.get("phase") == "hello"}
    rows = []
    for role, hp in spec.hosts.items():
        caps = hello.get(role, {})
        kernel = hp.kernel
        installed = caps.get("kernel_build") or {}
        os_ = caps.get("os") or {}
        rows.append({"host": role, "variant": kernel.name if kernel else None,
                     "vanilla": kernel.vanilla if kernel else None,
                     "build_key": kernel.build_key if kernel else None,
                     "release": caps.get("kernel_release"), "boot_id": caps.get("boot_id") or None,
                     "installed_build_key": installed.get("build_key"),
                     "os_system": os_.get("system"), "os_id": os_.get("id") or None,
                     "os_version_id": os_.get("version_id") or None})
    return rows
