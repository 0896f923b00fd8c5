"""Kernel variants as structured objects (docs/guards.md: G-VARIANT, G-BASELINE).

A variant is a distribution package or a source build (base + patches + config fragments + out-of-tree
modules) plus a `vanilla` flag; its content hash, not its name, identifies it in the run record, so a
"standard" kernel that carries local patches cannot pass for vanilla.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

from pydantic import model_validator

from orchestrator.plan.model.fields import Strict, _f

# Debian's kernel source packages (linux-source-6.1 holds a tarball of the tree Debian builds from)
SOURCE_PACKAGE = r"^linux-source-[0-9]+\.[0-9]+$"
# A Debian kernel image package; one `*` may stand for the ABI number (`linux-image-6.1.0-*-amd64`): the
# newest the testbed's apt knows, as a profile names it (the run records the release it ran)
IMAGE_PACKAGE = r"^linux-image-[0-9][A-Za-z0-9.+~-]*(\*[A-Za-z0-9.+~-]*)?$"
# source fields added after plans had results: out of the variant's hash while at these defaults
HASH_SKIP_IF_DEFAULT = {"package": None, "tarball": None, "config_base": "debian", "arch": "x86_64"}
ConfigBase = Literal["debian", "defconfig", "tinyconfig"]
# x86_64: a kernel for a machine or a VM guest (Debian packages); um: a User-Mode Linux kernel, a program the UML
# lab runs per host (the `linux` binary and its module tree)
Arch = Literal["x86_64", "um"]


class KernelSource(Strict):
    git: str | None = _f(None, "repository URL or local path of the kernel source (with `ref`)",
                         "https://git.kernel.org/pub/scm/linux/kernel/git/stable/linux.git")
    ref: str | None = _f(None, "tag or commit to build (with `git`)", "v5.0")
    package: str | None = _f(None, "a Debian kernel source package instead of a git tree", "linux-source-6.1",
                             pattern=SOURCE_PACKAGE)
    tarball: str | None = _f(None, "a source tarball already on disk (path relative to the plan) instead of a "
                             "git tree", "sources/linux-6.1.tar.xz")
    arch: Arch = _f("x86_64", "what the build is for: `x86_64` (Debian packages for a machine or a VM guest) or `um` "
                    "(a User-Mode Linux binary and its modules, for the UML lab; config_base defconfig or tinyconfig)",
                    "um")
    config_base: ConfigBase = _f("debian", "the config the fragments are merged into: Debian's config of the "
                                 "matching linux-image flavour, `make defconfig` or `make tinyconfig`", "tinyconfig")
    patches: list[str] = _f([], "patch files applied in order (paths relative to the plan)",
                            ["patches/lsaimd/0001-fractional-cwnd.patch"])
    config: list[str] = _f([], "config fragments merged into the distribution config",
                           ["configs/tcp-modules.config"])
    localversion: str = _f("", "appended to the release (uname -r)", "-lsaimd")

    @model_validator(mode="after")
    def _one_tree(self) -> KernelSource:
        trees = [x for x in (self.git, self.package, self.tarball) if x is not None]
        if len(trees) != 1 or (self.git is None) != (self.ref is None):
            raise ValueError("give one of `git` and `ref` (a git tree), `package` (a Debian source package) or "
                             "`tarball` (a file on disk)")
        if self.arch == "um" and self.config_base == "debian":
            raise ValueError("arch um: config_base debian (the default) is Debian's x86 kernel config, not a "
                             "User-Mode Linux one; give `config_base: defconfig` (or tinyconfig)")
        return self


class KernelVariant(Strict):
    """One kernel a host can be asked to run."""

    description: str = _f("", "what the variant is", "LS-AIMD stack patch on 5.0.0")
    vanilla: bool = _f(..., "true only for an unmodified upstream/distribution kernel with stock modules "
                       "(G-BASELINE: every campaign needs one)", True)
    package: str | None = _f(None, "a distribution kernel package (Debian: linux-image-<release>; one `*` may "
                             "stand for the ABI number: the newest the testbed knows)",
                             "linux-image-6.1.0-28-cloud-amd64", pattern=IMAGE_PACKAGE)
    source: KernelSource | None = _f(None, "a source build", {"git": "https://example.org/linux.git",
                                                              "ref": "v5.0"})
    modules: list[str] = _f([], "out-of-tree module sources built against the variant",
                            ["modules/tcp_lsaimd"])
    release: str | None = _f(None, "expected `uname -r` (default: from the package name)", "6.1.0-28-cloud-amd64")

    @model_validator(mode="after")
    def _one_origin(self) -> KernelVariant:
        if (self.package is None) == (self.source is None):
            raise ValueError("give exactly one of `package` (a distribution kernel) or `source` (a build)")
        return self

    @property
    def expected_release(self) -> str | None:
        if self.release:
            return self.release
        m = re.fullmatch(r"linux-image-(.+)", self.package or "")
        return m.group(1) if m else None

    @property
    def patched(self) -> bool:
        """Built with patches or config fragments of its own (so only a source build can carry it)."""
        return self.source is not None and bool(self.source.patches or self.source.config)

    def content_hash(self) -> str:
        """Hash of what the variant is made of (the name is only a label)."""
        doc = self.model_dump(mode="json")
        if doc.get("source"):
            doc["source"] = {k: v for k, v in doc["source"].items()
                             if k not in HASH_SKIP_IF_DEFAULT or v != HASH_SKIP_IF_DEFAULT[k]}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def abi_pattern(pattern: str) -> re.Pattern[str]:
    """A package or release name with one `*` standing for the ABI number (digits, captured as group 1)."""
    head, _, tail = pattern.partition("*")
    return re.compile(re.escape(head) + (r"([0-9]+)" + re.escape(tail) if "*" in pattern else ""))


def release_matches(expected: str | None, actual: str) -> bool:
    """A host's `uname -r` against a variant's expected release (None: any; `*`: the ABI number of a
    package pattern, digits only)."""
    return expected is None or abi_pattern(expected).fullmatch(actual) is not None
