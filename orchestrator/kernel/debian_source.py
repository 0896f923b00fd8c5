"""A Debian kernel source package, unpacked and prepared for module builds (effects).

Two uses, for a guest kernel whose Debian build leaves something out (7.2 has no sch_dualpi2.ko):
- the file of an in-tree module (`net/sched/sch_dualpi2.c`, modbuild.SOURCE_MODULES);
- host tools kbuild runs, built here when the kbuild package's own need a newer glibc (7.2's want 2.38):
  the tree is configured with the guest kernel's .config (`olddefconfig` with the host's gcc) and
  `make modules_prepare` builds objtool and modpost. Only those two binaries are used; the module itself is
  built against Debian's headers (orchestrator.kernel.debian_modules).

apt-get download (from whichever suite knows the package, orchestrator.lab.vm_image.apt_show), dpkg-deb
--fsys-tarfile, tar -xJ; cached in CACHE/source/<package>/<version>/ (`ready` once done, a lock around it).
"""
from __future__ import annotations

import fcntl
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.kernel.modbuild import ModuleBuildError
from orchestrator.lab import vm_image


@dataclass(frozen=True)
class SourceTree:
    package: str       # linux-source-7.2
    version: str       # 7.2.13-1
    root: Path         # …/linux-source-7.2 (the unpacked tree)
    unpack_s: float    # 0 when cached

    def file(self, rel: str) -> bytes:
        path = self.root / rel
        if not path.is_file():
            raise ModuleBuildError(f"{self.package} {self.version} has no {rel}")
        return path.read_bytes()


def _tar_argv(tarball: Path, dest: Path) -> list[str]:
    return ["tar", "-xJf", str(tarball), "-C", str(dest)]


def _fsys_argv(deb: Path, dest: Path) -> list[str]:
    return ["dpkg-deb", "-x", str(deb), str(dest)]


def _prepare_argv(root: Path, target: str, host_cc: str, jobs: int = 2) -> list[str]:
    return ["make", "-C", str(root), f"-j{jobs}", f"CC={host_cc}", f"HOSTCC={host_cc}", target]


def ensure_source(package: str, cache: Path, timeout_s: float = 900.0) -> SourceTree:
    """The unpacked tree of `package` (linux-source-7.2): downloaded and unpacked once."""
    version = vm_image.package_version(package)
    sdir = cache / "source" / package / version
    sdir.mkdir(parents=True, exist_ok=True)
    root = sdir / package
    started = time.monotonic()
    with open(sdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (sdir / "ready").exists():
            return SourceTree(package, version, root, 0.0)
        debs = sorted(sdir.glob(f"{package}_*.deb")) or [vm_image._download(package, sdir, timeout_s)]
        shutil.rmtree(sdir / "deb", ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        vm_image._run(_fsys_argv(debs[-1], sdir / "deb"), timeout=timeout_s)
        tarballs = list((sdir / "deb" / "usr" / "src").glob("linux-source-*.tar.xz"))
        if len(tarballs) != 1:
            raise ModuleBuildError(f"{debs[-1].name}: expected one usr/src/linux-source-*.tar.xz, found {tarballs}")
        vm_image._run(_tar_argv(tarballs[0], sdir), timeout=timeout_s)
        shutil.rmtree(sdir / "deb")
        if not root.is_dir():
            raise ModuleBuildError(f"{tarballs[0].name} did not unpack into {root.name}/")
        (sdir / "ready").write_text(f"{package} {version}\n")
    return SourceTree(package, version, root, time.monotonic() - started)


def host_tools(tree: SourceTree, config: str, host_cc: str, timeout_s: float = 900.0) -> tuple[Path, Path]:
    """(objtool, modpost) built on this machine from `tree`, configured with the guest kernel's `config`
    (cached: a second call with the same config builds nothing)."""
    objtool, modpost = tree.root / "tools/objtool/objtool", tree.root / "scripts/mod/modpost"
    stamp = tree.root / ".tcplab-tools"
    with open(tree.root.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == config and objtool.exists() and modpost.exists():
            return objtool, modpost
        (tree.root / ".config").write_text(config)
        vm_image._run(_prepare_argv(tree.root, "olddefconfig", host_cc), timeout=timeout_s)
        vm_image._run(_prepare_argv(tree.root, "modules_prepare", host_cc), timeout=timeout_s)
        if not (objtool.exists() and modpost.exists()):
            raise ModuleBuildError(f"make modules_prepare in {tree.root} built no objtool/modpost")
        stamp.write_text(config)
    return objtool, modpost
