"""Source variants meet their builds (effects: pins inputs, reads the build cache): before preflight, every run
whose host needs a source variant that `tcplab kernel build` has built expects that build's release (the key
is in it) and records the build key; a variant not built, or whose inputs cannot be pinned (a patch file
missing, a source unreachable), keeps no release, and preflight refuses its runs naming the variant
(docs/kernels.md). A `release` the plan states for a source variant is for kernels built outside tcplab:
a tcplab build of the variant takes its place."""
from __future__ import annotations

from pathlib import Path

from orchestrator.kernel import cache
from orchestrator.kernel.sources import SourceError, resolve
from orchestrator.plan import RunSpec
from orchestrator.plan.model.kernels import KernelVariant


def attach_builds(specs: list[RunSpec], kernels: dict[str, KernelVariant], plan_dir: Path,
                  root: Path = cache.DEFAULT_ROOT) -> tuple[list[RunSpec], dict[str, str]]:
    """The runs with each built source variant's release and key; and, per variant that has no build, why."""
    needed = sorted({h.kernel.name for s in specs for h in s.hosts.values()
                     if h.kernel is not None and kernels.get(h.kernel.name) is not None
                     and kernels[h.kernel.name].source is not None})
    builds: dict[str, cache.Entry] = {}
    missing: dict[str, str] = {}
    for name in needed:
        try:
            key = resolve(name, kernels[name], plan_dir).key
        except SourceError as exc:
            missing[name] = str(exc)
            continue
        entry = cache.entry(root, key)
        if entry is None:
            missing[name] = f"not built yet (key {key[:16]}): `tcplab kernel build PLAN {name}`"
        else:
            builds[name] = entry
    if not builds:
        return specs, missing
    out = []
    for s in specs:
        hosts = {role: h if h.kernel is None or h.kernel.name not in builds else h.model_copy(update={
            "kernel": h.kernel.model_copy(update={"release": builds[h.kernel.name].release,
                                                  "build_key": builds[h.kernel.name].key})})
            for role, h in s.hosts.items()}
        out.append(s.model_copy(update={"hosts": hosts}))
    return out, missing
