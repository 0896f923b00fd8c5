"""What a kernel build is made of, as data (pure): its inputs, its key, its LOCALVERSION, and the checks on its
config (docs/kernels.md).

A build's **key** is the sha256 of the canonical inputs' contents: the source (a Debian source package and its
version, the commit a git ref resolved to, or a tarball's sha256), every patch's and config fragment's sha256 in
order, the config base, the architecture (`um`; an x86_64 key predates the choice and hashes as it did), every
out-of-tree module's tree hash, the localversion the plan asked for, and the toolchain's versions (gcc, ld,
make). Paths and names are not in it. The build runs with a fixed timestamp, user and host so that the same key
gives the same package contents (all but the headers' objtool: docs/kernels.md). The key's first hex digits go
into LOCALVERSION, so `uname -r` on a host names the exact build it runs.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Literal

KEY_IN_RELEASE = 10                    # hex digits of the key in LOCALVERSION (40 bits: collisions are moot)
CONFIG_LINE = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
UNSET_LINE = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")
LOCALVERSION_CHARS = re.compile(r"[^A-Za-z0-9.+-]")
# fixed so that two builds of one key give the same packages (Documentation/kbuild/reproducible-builds.rst;
# with builder.py's changelog date and mtime clamping; docs/kernels.md)
REPRODUCIBLE_ENV = {"KBUILD_BUILD_TIMESTAMP": "1970-01-01 00:00:00 UTC", "KBUILD_BUILD_USER": "tcplab",
                    "KBUILD_BUILD_HOST": "tcplab", "KBUILD_BUILD_VERSION": "1", "SOURCE_DATE_EPOCH": "0",
                    "KDEB_CHANGELOG_DIST": "tcplab", "LC_ALL": "C", "TZ": "UTC"}

SourceKind = Literal["debian-package", "git", "tarball"]
DEFAULT_ARCH = "x86_64"


@dataclass(frozen=True)
class SourceRef:
    """Where the tree comes from, pinned: `version` is the Debian package version, the git commit, or the
    tarball's sha256."""

    kind: SourceKind
    name: str              # package name, git URL, or tarball path
    version: str


@dataclass(frozen=True)
class FileInput:
    """A patch, config fragment or module tree: its name as the plan gives it and the sha256 of its content."""

    name: str
    sha256: str


@dataclass(frozen=True)
class BuildInputs:
    variant: str
    source: SourceRef
    config_base: str
    patches: tuple[FileInput, ...] = ()
    fragments: tuple[FileInput, ...] = ()
    modules: tuple[FileInput, ...] = ()
    localversion: str = ""
    toolchain: dict[str, str] = field(default_factory=dict)
    arch: str = DEFAULT_ARCH       # x86_64 (Debian packages) or um (a User-Mode Linux binary and its modules)

    def canonical(self) -> dict:
        """Everything pinned, names included (metadata.json's `inputs`)."""
        doc = asdict(self)
        del doc["variant"]
        return doc

    def content(self) -> dict:
        """What the key hashes: contents, not names. The variant's name and the paths patches, fragments,
        modules and tarballs are given by are labels: the same files under another path or in another clone
        are the same build. A Debian source package is named by its package name and version. The arch is in
        it unless it is x86_64: keys made before there was a choice stay the keys of the same builds (cached
        entries, and the build keys runs recorded)."""
        s = self.source
        doc = {"source": [s.kind, s.name if s.kind == "debian-package" else "", s.version],
               "config_base": self.config_base, "patches": [p.sha256 for p in self.patches],
               "fragments": [f.sha256 for f in self.fragments], "modules": [m.sha256 for m in self.modules],
               "localversion": self.localversion, "toolchain": self.toolchain}
        return doc if self.arch == DEFAULT_ARCH else {**doc, "arch": self.arch}

    @property
    def key(self) -> str:
        return build_key(self)


def build_key(inputs: BuildInputs) -> str:
    return hashlib.sha256(json.dumps(inputs.content(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def localversion(inputs: BuildInputs) -> str:
    """CONFIG_LOCALVERSION: the plan's localversion (or the variant's name) and the key's prefix, so the release
    reads `6.1.192-lsaimd-3f2a9c1b7e`."""
    label = inputs.localversion.lstrip("-") or inputs.variant
    label = LOCALVERSION_CHARS.sub("-", label)[:40].strip("-") or "tcplab"
    return f"-{label}-{inputs.key[:KEY_IN_RELEASE]}"


def parse_config(text: str) -> dict[str, str]:
    """A .config or fragment as symbol -> value (`y`, `m`, `"text"`, numbers; `n` for `# ... is not set`)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if m := CONFIG_LINE.match(line):
            out[m.group(1)] = m.group(2)
        elif m := UNSET_LINE.match(line):
            out[m.group(1)] = "n"
    return out


def dropped_symbols(fragment: dict[str, str], final: dict[str, str]) -> list[str]:
    """Fragment lines the final config does not carry (olddefconfig drops a symbol whose dependencies are
    unmet, or that this tree does not have): each as `CONFIG_X=want (got: value)`."""
    out = []
    for name, want in fragment.items():
        got = final.get(name, "n")
        if got != want:
            out.append(f"{name}={want} (got: {'not set' if got == 'n' else got})")
    return out


def release_of(kernelversion: str, inputs: BuildInputs) -> str:
    """`uname -r` of the build: the tree's kernelversion (`make -s kernelversion`) and the LOCALVERSION."""
    return kernelversion + localversion(inputs)
