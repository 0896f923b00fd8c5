"""A testbed profile: how a study plan is adapted to one testbed without editing the plan.

A plan says what the study did (its kernels, its rates, where it captured); a profile says what this testbed
can do instead: which kernel stands in for each of the plan's variants, how far rates must come down for the
testbed to forward them, and which hosts must not capture. `tcplab plan expand PLAN --profile P` shows the
runs it gives; every run records the profile and each substitution made (docs/profiles.md).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import PrivateAttr, StringConstraints, model_validator

from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.kernels import IMAGE_PACKAGE, SOURCE_PACKAGE, KernelVariant
from orchestrator.plan.model.names import RoleName
from orchestrator.plan.model.quantities import Rate, Size

ProfileName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}$")]
GUESTS_WITH_KERNEL = "with_kernel"


class Testbed(Strict):
    """The lab a profile is for: `tcplab lab up --plan P --profile F` builds it."""

    kind: Literal["netns", "vm", "uml", "physical"] = _f(..., "netns: namespaces on this machine (its kernel); vm: "
                                                         "QEMU guests for some hosts; uml: every host a User-Mode "
                                                         "Linux kernel; physical: hosts of an inventory.ini",
                                                  "vm")
    guests: list[RoleName] | Literal["all", "with_kernel"] = _f(
        GUESTS_WITH_KERNEL, "vm: the hosts that are guests: a list of roles, `all`, or `with_kernel` (every host "
        "some run gives a kernel variant, and the aqm)", GUESTS_WITH_KERNEL)
    kernel: str | None = _f(None, "vm: the Debian kernel package the guests boot (one `*` for the ABI number: "
                            "the newest apt knows)", "linux-image-6.1.0-*-amd64", pattern=IMAGE_PACKAGE)


class VariantRef(Strict):
    """A kernel variant another plan file declares: a lab's own kernel file (experiments/kernels/uml-lab.yaml)."""

    plan: str = _f(..., "the plan file that declares it, relative to the profile", "../kernels/uml-lab.yaml",
                   pattern=r"^[A-Za-z0-9_./-]{1,200}\.ya?ml$")
    variant: str = _f(..., "the variant's name there", "uml-6.1-cwnd-3.15", pattern=r"^[A-Za-z0-9_.+-]{1,64}$")


class KernelRule(Strict):
    """Which kernel stands in for the plan's variants whose name matches. The first matching rule applies;
    a variant no rule matches stays as the plan states it."""

    match: str = _f("*", "glob on the plan's variant names", "k-*-5.9",
                    pattern=r"^[A-Za-z0-9_.+*?\[\]-]{1,64}$")
    vanilla: bool | None = _f(None, "match only vanilla (true) or only modified (false) variants", True)
    running: bool = _f(False, "the kernel each host already runs stands in (a netns lab boots nothing); only "
                       "for vanilla variants: a study's modification cannot be left out silently", True)
    package: str | None = _f(None, "for a variant without patches or config fragments of its own: this "
                             "distribution kernel, with the variant's out-of-tree modules",
                             "linux-image-6.1.0-*-amd64", pattern=IMAGE_PACKAGE)
    source: str | None = _f(None, "for a variant with patches or config fragments: a build of this Debian source "
                            "package with the same patches, fragments and modules (where they apply)",
                            "linux-source-6.1", pattern=SOURCE_PACKAGE)
    build: VariantRef | None = _f(None, "for any variant: this variant of another plan file, built as that file "
                                 "declares it -- a study's mechanism carried onto the testbed's own kernel, when the "
                                 "study's kernel cannot be built here",
                                 {"plan": "../kernels/uml-lab.yaml", "variant": "uml-6.1-cwnd-3.15"})
    why: str = _f("", "recorded with the substitution", "the testbed boots Debian 6.1 kernels only")
    # the `build` variant as its file declares it, and that file's directory (its paths are relative to it):
    # set by the profile loader, which reads the file (orchestrator/plan/checks/profile_loader.py)
    _stand_in: tuple[KernelVariant, str] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _something(self) -> KernelRule:
        if self.running:
            if (self.package is not None or self.source is not None or self.build is not None
                    or self.vanilla is not True):
                raise ValueError("`running: true` stands alone and needs `vanilla: true`")
        elif self.build is not None:
            if self.package is not None or self.source is not None:
                raise ValueError("`build` stands alone: the variant it names says what is built")
        elif self.package is None and self.source is None:
            raise ValueError("a kernel rule gives a `package`, a `source`, both, a `build`, or `running: true`")
        return self

    @property
    def stand_in(self) -> tuple[KernelVariant, str] | None:
        return self._stand_in

    def with_stand_in(self, variant: KernelVariant, files_dir: str) -> KernelRule:
        """This rule with its `build` variant read (files_dir: the directory its paths are relative to)."""
        out = self.model_copy()
        out._stand_in = (variant, files_dir)
        return out

    def __eq__(self, other: object) -> bool:
        # the fields only: the loader's reading of `build` is not what the rule says (pydantic compares the
        # private attributes too)
        return isinstance(other, KernelRule) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(tuple(self.__dict__.values()))


class Scaling(Strict):
    """Rates brought down to what the testbed forwards, by one factor for the whole plan (a rate sweep keeps its
    ratios): max_rate / the plan's largest rate rounded down to 1, 2 or 5 x 10^k, or `factor` as given;
    never above 1."""

    max_rate: Rate | None = _f(None, "the largest rate the testbed forwards reliably", "100mbit")
    factor: float | None = _f(None, "scale every rate by this (instead of max_rate)", 0.01, gt=0, le=1)
    keep: Literal["bdp", "delay"] = _f(
        "bdp", "`bdp`: path delays and queue times grow by 1/factor, so BDPs, queues and thresholds stay the "
        "same in packets (a slowed-down copy of the path); `delay`: times stay, so queues hold fewer packets",
        "bdp")

    @model_validator(mode="after")
    def _one(self) -> Scaling:
        if (self.max_rate is None) == (self.factor is None):
            raise ValueError("give one of `max_rate` or `factor`")
        return self


class CapturePlacement(Strict):
    """Where the testbed captures instead of where the plan says."""

    move_off: list[RoleName] = _f([], "hosts that must not capture (a TCG guest's tcpdump takes the CPU it "
                                  "forwards with): their capture points move to the other end of the same link",
                                  ["aqm"])
    snaplen: Size | None = _f(None, "keep at most this many bytes per packet", 96)


class Profile(Strict):
    """A testbed profile (format version 1)."""

    version: Literal[1] = _f(1, "profile format version", 1)
    name: ProfileName = _f(..., "profile name (recorded with every run)", "vm-lab")
    description: str = _f("", "what testbed the profile is for", "QEMU TCG guests on a 2-core machine")
    testbed: Testbed = _f(..., "the lab the profile is for", {"kind": "vm"})
    kernels: list[KernelRule] = _f([], "kernel substitutions, first match wins",
                                   [{"match": "*", "package": "linux-image-6.1.0-*-amd64"}])
    scale: Scaling | None = _f(None, "rate (and delay) scaling", {"max_rate": "100mbit"})
    captures: CapturePlacement | None = _f(None, "capture placement", {"move_off": ["aqm"]})


__all__ = ["CapturePlacement", "GUESTS_WITH_KERNEL", "KernelRule", "Profile", "Scaling", "Testbed", "VariantRef"]
