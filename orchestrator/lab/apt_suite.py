"""Debian suites other than the machine's own, for guest kernels only (pure).

Debian's unstable suite carries kernels the machine's release does not (7.2, with `sch_dualpi2.c` in its
source). Its index is kept apart from the system's: a private sources.list, lists and package cache under
the VM lab's cache, handed to apt-get/apt-cache as `-o` options, so the system's apt state is untouched.
Its packages are only downloaded and unpacked (dpkg-deb -x) for guests; nothing is installed here.

The effects (write the list, `apt-get update`) are orchestrator.lab.vm_image.suite_options.
"""
from __future__ import annotations

import re
from pathlib import Path

EXTRA_SUITES = ("unstable",)       # asked, in order, for a package the system's apt does not know
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MAX_LIST_AGE_S = 24 * 3600         # an older index is refreshed before use


def mirror_from_sources(texts: list[str]) -> str:
    """The Debian archive URL the machine uses, from the text of its sources files (deb822 `URIs:` or one-line
    `deb URL suite ...`); the first one that serves `debian` and not `debian-security`."""
    for text in texts:
        for url in re.findall(r"^\s*URIs:\s*(.+)$", text, re.M) + re.findall(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)",
                                                                             text, re.M):
            for u in url.split():
                if re.search(r"/debian/?$", u):
                    return u.rstrip("/")
    return DEFAULT_MIRROR


def sources_line(mirror: str, suite: str) -> str:
    """The one line of the private sources.list."""
    return f"deb [signed-by={KEYRING}] {mirror} {suite} main\n"


def suite_dir(cache_root: Path, suite: str) -> Path:
    return cache_root / "apt" / suite


def options(sdir: Path) -> list[str]:
    """apt-get/apt-cache options that read only the private list and keep its index and .debs apart."""
    return ["-o", f"Dir::Etc::sourcelist={sdir / 'sources.list'}", "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={sdir / 'lists'}", "-o", f"Dir::Cache={sdir / 'cache'}",
            "-o", "APT::Get::List-Cleanup=0"]


def update_argv(opts: list[str]) -> list[str]:
    return ["apt-get", "-q", *opts, "update"]


def depends(show: str) -> list[str]:
    """Package names in the Depends field of `apt-cache show --no-all-versions` (alternatives: the first)."""
    m = re.search(r"^Depends: (.+)$", show, re.M)
    if not m:
        return []
    return [alt.split("|")[0].split("(")[0].strip() for alt in m.group(1).split(",")]


def split_parts(package: str, deps: list[str]) -> list[str]:
    """The packages that hold a kernel image's files. Up to 6.12 the image package holds them itself; from 7.x
    Debian splits it: `linux-image-R` depends on `linux-binary-R` (vmlinuz), `linux-modules-R` (the modules,
    .ko.xz) and `linux-base-R` (config, modules.order/builtin)."""
    rel = package.removeprefix("linux-image-").removesuffix("-unsigned")
    parts = [f"linux-{kind}-{rel}" for kind in ("base", "binary", "modules")]
    if f"linux-binary-{rel}" not in deps:
        return [package]
    return [p for p in parts if p in deps]
