"""`tcplab kernel install|verify` (effects): playbooks/kernel-install.yml for a kernel on testbed hosts.

The kernel is a `tcplab kernel build` (its key, key prefix, release or variant: its linux-image package from
the build cache) or a Debian image package (a `*` may stand for the ABI number; the .deb is downloaded here,
since testbed hosts need no internet). What is verified after the boot: the release and a new boot_id, the
modules given, each congestion control in tcp_available_congestion_control, each qdisc created in a scratch
network namespace; only then does the kernel become the default boot entry.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from orchestrator.ansible.provision import targets
from orchestrator.ansible.runner import PlaybookResult, run_playbook
from orchestrator.inventory import InventoryError
from orchestrator.kernel import cache
from orchestrator.lab import grubenv, vm_image
from schemas.qdiscs import KINDS


@dataclass(frozen=True)
class KernelTarget:
    release: str
    variant: str
    build_key: str | None
    packages: tuple[Path, ...]

    def extravar(self, modules: list[str], ccs: list[str], qdiscs: list[str]) -> dict:
        return {"release": self.release, "variant": self.variant, "build_key": self.build_key,
                "title_prefix": grubenv.debian_title(""), "packages": [str(p) for p in self.packages],
                "modules": modules, "ccs": ccs, "qdiscs": [qdisc_probe(q) for q in qdiscs]}


def qdisc_probe(kind: str) -> dict:
    """The tc arguments that create `kind` as a root qdisc: the agent's own capability probe's (one definition
    per kind, schemas/qdiscs/)."""
    if kind not in KINDS:
        raise InventoryError(f"--qdisc {kind}: not a qdisc kind tcplab knows ({', '.join(sorted(KINDS))})")
    probe = KINDS[kind].probe
    if probe is None:
        raise InventoryError(f"--qdisc {kind}: tc cannot create it (configured over netlink); a run checks it")
    return {"kind": probe[0], "args": " ".join(shlex.quote(a) for a in probe[1:])}


def resolve(target: str, cache_root: Path = cache.DEFAULT_ROOT) -> KernelTarget:
    """A cached tcplab build, or a Debian linux-image package."""
    builds = cache.find(cache_root, target) if cache_root.exists() else []
    if len(builds) > 1:
        raise InventoryError(f"{target!r} names {len(builds)} cached builds: give more of the key "
                             f"({', '.join(e.key[:12] for e in builds)})")
    if builds:
        e = builds[0]
        images = sorted(e.path.glob(f"linux-image-{e.release}_*.deb"))
        if not images:
            raise InventoryError(f"build {e.key[:12]} has no linux-image-{e.release} package")
        return KernelTarget(e.release, e.metadata.get("variant", e.key[:12]), e.key, (images[0],))
    if target.startswith("linux-image-"):
        package = vm_image.resolve_package(target)
        return KernelTarget(package.removeprefix("linux-image-"), package, None, (vm_image.package_deb(package),))
    raise InventoryError(f"{target!r} is neither a cached build (tcplab kernel ls) nor a linux-image package")


def install(inventory: Path, target: KernelTarget, roles: list[str] | None, console: Console,
            modules: list[str] = (), ccs: list[str] = (), qdiscs: list[str] = (),
            verify_only: bool = False) -> PlaybookResult:
    _inv, hosts = targets(inventory, roles)
    what = "verify" if verify_only else "install"
    console.print(f"kernel {what}: {target.release} ({target.variant}"
                  f"{f', build {target.build_key[:12]}' if target.build_key else ''}) on "
                  f"{', '.join(f'{n} ({r})' for n, r in hosts.items())}")
    return run_playbook("kernel-install.yml", inventory,
                        {"tcplab_hosts": ",".join(hosts), "tcplab_verify_only": verify_only,
                         "tcplab_kernel": target.extravar(list(modules), list(ccs), list(qdiscs))},
                        limit=",".join(hosts), console=console)
