"""Kernel variants as structured objects (docs/guards.md: G-VARIANT, G-BASELINE).

A variant is a distribution package or a source build (base + patches + config fragments + out-of-tree
modules) plus a `vanilla` flag; its content hash, not its name, identifies it in the run record, so a
"standard" kernel that carries local patches cannot pass for vanilla.
"""
from __future__ import annotations

import hashlib
import json
import re

from pydantic import model_validator

from orchestrator.plan.model.fields import Strict, _f


class KernelSource(Strict):
    git: str = _f(..., "repository URL or local path of the kernel source", "https://git.kernel.org/pub/scm/"
                  "linux/kernel/git/stable/linux.git")
    ref: str = _f(..., "tag or commit to build", "v5.0")
    patches: list[str] = _f([], "patch files applied in order (paths relative to the plan)",
                            ["patches/lsaimd/0001-fractional-cwnd.patch"])
    config: list[str] = _f([], "config fragments merged into the distribution config",
                           ["configs/tcp-modules.config"])
    localversion: str = _f("", "appended to the release (uname -r)", "-lsaimd")


class KernelVariant(Strict):
    """One kernel a host can be asked to run."""

    description: str = _f("", "what the variant is", "LS-AIMD stack patch on 5.0.0")
    vanilla: bool = _f(..., "true only for an unmodified upstream/distribution kernel with stock modules "
                       "(G-BASELINE: every campaign needs one)", True)
    package: str | None = _f(None, "a distribution kernel package (Debian: linux-image-<release>)",
                             "linux-image-6.1.0-28-cloud-amd64")
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

    def content_hash(self) -> str:
        """Hash of what the variant is made of (the name is only a label)."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
