"""Cells and trials of a campaign (pure): a variant applied to a plan document, the cell key every variant of one
cell shares, and the RunSpec of one trial (its run id, repetition and seed).

A cell is everything but the variable under test: plan, experiment, arm, matrix values, profile. Its key is the
sha256 of the baseline's run spec with the run id, seed, repetition and every host's kernel left out, so a kernel
or an override changes the variant, never the cell; editing a comment in the plan changes neither.
"""
from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

from orchestrator.plan import RunSpec
from orchestrator.plan.expansion.canon import canonical_json
from orchestrator.plan.model.kernels import KernelVariant
from orchestrator.plan.model.paths import KeyPath, set_in

SHORT_KEY = 12          # hex digits of the cell key in run ids and labels
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
VARIANT_ID_CHARS = 24   # a variant's name in run ids (the loader checks they stay distinct)


def kernel_document(kernel: KernelVariant, campaign_dir: Path) -> dict[str, Any]:
    """The kernel as a plan's `kernels:` entry, its files (patches, fragments, tarball, modules) made absolute: the
    campaign names them relative to itself, the plan they are put into may sit elsewhere."""
    doc = kernel.model_dump(mode="json", exclude_defaults=True) | {"vanilla": kernel.vanilla}

    def absolute(p: str) -> str:
        return p if "://" in p or Path(p).is_absolute() else str((campaign_dir / p).resolve())

    src = doc.get("source")
    if src:
        for name in ("patches", "config"):
            if name in src:
                src[name] = [absolute(p) for p in src[name]]
        if src.get("tarball"):
            src["tarball"] = absolute(src["tarball"])
        if src.get("git") and (campaign_dir / src["git"]).exists():   # a local tree, not a URL
            src["git"] = absolute(src["git"])
    if "modules" in doc:
        doc["modules"] = [absolute(p) for p in doc["modules"]]
    return doc


def variant_document(doc: dict[str, Any], kname: str, kernel_doc: dict[str, Any], roles: list[str],
                     overrides: dict[KeyPath, Any]) -> dict[str, Any]:
    """The plan document with a variant applied: its kernel added to `kernels:` as `kname` and named by
    `run.hosts.<role>.kernel` for `roles` (none: every role of the plan), then its overrides set in `run:`."""
    out = copy.deepcopy(doc)
    out["kernels"] = {**(out.get("kernels") or {}), kname: kernel_doc}
    run = out.get("run") or {}
    for role in roles or list(out.get("roles") or []):
        run = set_in(run, ("hosts", role, "kernel"), kname)
    for path, value in overrides.items():
        run = set_in(run, path, value)
    out["run"] = run
    return out


def cell_document(spec: RunSpec) -> dict[str, Any]:
    """What identifies the cell: the spec without run id, seed, repetition and any host's kernel."""
    doc = spec.model_dump(mode="json")
    for name in ("run_id", "seed", "repetition"):
        doc.pop(name, None)
    for host in doc.get("hosts", {}).values():
        host.pop("kernel", None)
    doc.pop("substitutions", None)   # the profile's kernel stand-ins depend on the variant
    return doc


def cell_key(spec: RunSpec) -> str:
    return hashlib.sha256(canonical_json(cell_document(spec)).encode()).hexdigest()


def cell_match(spec: RunSpec) -> tuple[str, str, str, int]:
    """How the same cell is found in every variant's expansion: plan, experiment, arm, matrix cell index."""
    return spec.plan_name, spec.experiment, str(spec.params.get("arm", "")), spec.cell


def cell_label(spec: RunSpec) -> str:
    """Readable name of a cell: plan/experiment[/arm] and the matrix values (what the report shows)."""
    params = {k: v for k, v in spec.params.items() if k != "arm" and not k.endswith(("_bit", "_s", "_ns", "_bytes"))}
    values = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    arm = spec.params.get("arm")
    return "/".join([spec.plan_name, spec.experiment] + ([str(arm)] if arm else [])) + (f" {values}" if values else "")


def variant_id(name: str) -> str:
    return _UNSAFE.sub("_", name)[:VARIANT_ID_CHARS]


def trial_run_id(campaign: str, night: int, key: str, variant: str, repetition: int, attempt: int) -> str:
    """The stored run id of one trial: unique per campaign, night, cell, variant, repetition and attempt, so
    nightly reruns keep their history instead of overwriting it."""
    return f"{campaign}-n{night}-{key[:SHORT_KEY]}-{variant_id(variant)}-r{repetition}a{attempt}"


def trial_seed(campaign_seed: int, key: str, repetition: int) -> int:
    """The run seed of a repetition: the same for every variant of the cell (paired), different per repetition."""
    digest = hashlib.sha256(f"{campaign_seed}/{key}/{repetition}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


def trial_spec(template: RunSpec, run_id: str, repetition: int, seed: int) -> RunSpec:
    return template.model_copy(update={"run_id": run_id, "repetition": repetition, "seed": seed})
