"""Out-of-tree kernel modules for the VM lab's guests (pure): which Debian packages hold the headers of a
guest kernel, the argv that fetch, unpack, build and inspect, where things go in the cache and the cache key.

The effects (apt-get download, dpkg-deb -x, make, modinfo) are orchestrator.kernel.debian_modules; the make
and modinfo argv are orchestrator.kernel.argv's, shared with variant builds. Nothing is
installed on this machine: the header packages are unpacked into the cache and kbuild runs from there.
Docs: docs/modules.md.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.lab.vm_recipe import PACKAGE_RE, ImageError

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULES_DIR = REPO_ROOT / "experiments" / "modules"
SOURCE_SUFFIXES = (".c", ".h")
SOURCE_NAMES = ("Kbuild", "Makefile")


class ModuleBuildError(ImageError):
    pass


@dataclass(frozen=True)
class HeaderPackages:
    """The three packages kbuild needs for one Debian kernel image."""

    release: str      # `uname -r` of the guest: 6.1.0-56-amd64
    flavour: str      # linux-headers-6.1.0-56-amd64 (the configured tree: .config, Module.symvers)
    common: str       # linux-headers-6.1.0-56-common (the shared headers and top Makefile)
    kbuild: str       # linux-kbuild-6.1 (scripts/, fixdep, modpost)

    @property
    def names(self) -> list[str]:
        return [self.flavour, self.common, self.kbuild]

    def flavour_dir(self, root: Path) -> Path:
        """The kernel build dir (`make -C` target) inside an unpacked tree."""
        return root / "usr" / "src" / self.flavour


@dataclass(frozen=True)
class BuiltModule:
    name: str          # sch_aqm_mark
    ko: Path
    vermagic: str
    release: str
    key: str           # the cache key (sha256 of sources, headers version, compiler)
    build_s: float     # 0 when it came from the cache

    def to_json(self) -> dict:
        return {"name": self.name, "ko": str(self.ko), "vermagic": self.vermagic, "release": self.release,
                "key": self.key, "build_s": round(self.build_s, 2)}


def header_packages(image_package: str) -> HeaderPackages:
    """linux-image-6.1.0-56-amd64 -> linux-headers-6.1.0-56-{amd64,common}, linux-kbuild-6.1;
    linux-image-6.12.43+deb12-amd64 -> linux-headers-6.12.43+deb12-{amd64,common}, linux-kbuild-6.12.43+deb12."""
    m = PACKAGE_RE.match(image_package)
    if not m:
        raise ModuleBuildError(f"{image_package!r} is not a Debian kernel image package")
    abi, flavour = m.group("abi"), m.group("flavour")
    series = re.fullmatch(r"(\d+\.\d+)\.0-\d+", abi)
    kbuild = f"linux-kbuild-{series.group(1)}" if series else f"linux-kbuild-{abi}"
    return HeaderPackages(release=f"{abi}-{flavour}", flavour=f"linux-headers-{abi}-{flavour}",
                          common=f"linux-headers-{abi}-common", kbuild=kbuild)


def relocated_makefile(text: str, root: Path) -> str:
    """Debian's flavour Makefile includes the common tree by absolute path (`include /usr/src/linux-headers-
    …-common/Makefile`; 7.x also sets `KBUILD_OUTPUT=/usr/src/…-amd64`); point them into the unpacked tree.
    The scripts/tools symlinks are relative already."""
    out, n = re.subn(r"^include /usr/src/", f"include {root}/usr/src/", text, flags=re.M)
    if n != 1:
        raise ModuleBuildError("unexpected flavour Makefile: no `include /usr/src/…` line")
    return re.sub(r"^KBUILD_OUTPUT\s*=\s*/usr/src/", f"KBUILD_OUTPUT={root}/usr/src/", out, flags=re.M)


# Modules Debian's config leaves out but the kernel's own source has: built from the source package's file
# (orchestrator.kernel.debian_source) instead of experiments/modules/. name -> (path in the tree, config option)
SOURCE_MODULES = {"sch_dualpi2": ("net/sched/sch_dualpi2.c", "CONFIG_NET_SCH_DUALPI2")}


def source_package(image_package: str) -> str:
    """linux-image-7.2.13+deb14-amd64 -> linux-source-7.2; linux-image-6.1.0-56-amd64 -> linux-source-6.1."""
    m = PACKAGE_RE.match(image_package)
    if not m:
        raise ModuleBuildError(f"{image_package!r} is not a Debian kernel image package")
    return "linux-source-" + ".".join(m.group("abi").split(".")[:2])


def source_module_files(name: str, source: bytes) -> dict[str, bytes]:
    """The out-of-tree build of one in-tree file: the file and a one-line Kbuild."""
    return {f"{name}.c": source, "Kbuild": f"obj-m += {name}.o\n".encode()}


def config_state(config: str, option: str) -> str | None:
    """`y`, `m`, another value, or None (`# … is not set` / absent) for one option of a .config."""
    m = re.search(rf"^{re.escape(option)}=(.*)$", config, re.M)
    return m.group(1) if m else None


def substitute_compiler_vars(config: str, host_cc: str, tools: tuple[Path, Path] | None) -> list[str]:
    """make variables that build a module with the host's compiler against headers configured for a newer
    one (7.2's are for gcc 16; this machine has gcc 12), each with its reason:
    - CC: the host's compiler (the headers' `x86_64-linux-gnu-gcc-16` is not installed);
    - CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT empty: gcc < 14 rejects `-fmin-function-alignment=16`; the top
      Makefile then passes `-falign-functions=16`, its own fallback for older compilers (same alignment);
    - CONFIG_DEBUG_INFO_BTF_MODULES empty: no BTF for the module (pahole here is older than the kernel's, and
      the kbuild package's resolve_btfids needs glibc 2.38); a qdisc needs none;
    - objtool, MODPOST: `tools` = (objtool, modpost) built on this machine from the same kernel's source, when
      the kbuild package's binaries need a newer glibc than this machine's (7.2's: GLIBC_2.38; bookworm: 2.36).
    Module ABI is unchanged: the headers, .config and Module.symvers are Debian's."""
    out = [f"CC={host_cc}"]
    if config_state(config, "CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT") == "y":
        out.append("CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=")
    if config_state(config, "CONFIG_DEBUG_INFO_BTF_MODULES") == "y":
        out.append("CONFIG_DEBUG_INFO_BTF_MODULES=")
    if tools is not None:
        out += [f"objtool={tools[0]}", f"MODPOST={tools[1]}"]
    return out


def needs_newer_glibc(output: str) -> bool:
    """What the dynamic loader prints when a binary was linked against a newer glibc than this one."""
    return bool(re.search(r"version `GLIBC_[\d.]+' not found", output))


def module_sources(module_dir: Path) -> dict[str, bytes]:
    """The files of an out-of-tree module that go into the build (and its cache key); not what an in-place
    build leaves behind (`x.mod.c`)."""
    return {p.name: p.read_bytes() for p in sorted(module_dir.iterdir())
            if p.is_file() and not p.name.endswith(".mod.c")
            and (p.suffix in SOURCE_SUFFIXES or p.name in SOURCE_NAMES)}


def cache_key(sources: dict[str, bytes], headers_version: str, compiler: str) -> str:
    """sha256 over the module's files (names and bytes), the headers package version and the compiler's
    `--version` line: a change to any of them builds again."""
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + len(sources[name]).to_bytes(8, "big") + sources[name])
    h.update(b"\0headers\0" + headers_version.encode() + b"\0cc\0" + compiler.encode())
    return h.hexdigest()


def compiler_from_variables(text: str) -> str:
    """The compiler Debian built the kernel with, from the headers' .kernelvariables (`CC = … gcc-12`)."""
    m = re.search(r"^CC\s*=.*?(\S*gcc(-\d+)?)\s*$", text, re.M)
    if not m:
        return "gcc"
    return m.group(1).replace("$(CROSS_COMPILE)", "")


def headers_dir(cache: Path, packages: HeaderPackages, version: str) -> Path:
    return cache / "headers" / packages.release / version


def build_dir(cache: Path, name: str, key: str) -> Path:
    return cache / "build" / name / key[:16]


def compiler_version_argv(compiler: str) -> list[str]:
    return [compiler, "--version"]


def first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


def check_vermagic(built: str, guest: str) -> None:
    if built.strip() != guest.strip():
        raise ModuleBuildError(f"built module's vermagic {built.strip()!r} != the guest kernel's {guest.strip()!r}")


def reference_module(paths: Iterable[Path]) -> Path | None:
    """A module of the guest's own tree to read its vermagic from (the first .ko)."""
    return next((p for p in sorted(paths) if p.name.endswith(".ko")), None)
