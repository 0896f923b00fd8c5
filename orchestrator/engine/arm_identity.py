"""Arms a testbed profile makes identical (pure): two arms of a plan that differ as planned (a kernel each) but
give the same runs once a profile has adapted them (both kernels stood in for by one) compare nothing on that
testbed, however runnable each run is alone. `tcplab run` says so before it runs anything, and a study marks
the comparison not reproducible (docs/studies.md, "Comparisons a testbed erases").

Two runs are the same experiment when a host would see no difference: every field but the run's names (id,
seed, the matrix labels in params, the substitution notes), each host's kernel by the release and build it
boots rather than the variant's label and description.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.plan import RunSpec

_NAMES = ("run_id", "seed", "params", "substitutions")


@dataclass(frozen=True)
class ErasedArms:
    arms: tuple[str, ...]
    why: str


def host_view(spec: RunSpec) -> str:
    """The run as its hosts see it, as a comparable string (see the module docstring). A kernel known only by
    its definition (no release yet) keeps the definition's hash."""
    doc: dict[str, Any] = {k: v for k, v in spec.model_dump(mode="json").items() if k not in _NAMES}
    for host in doc.get("hosts", {}).values():
        if host.get("kernel"):
            host["kernel"] = {k: v for k, v in host["kernel"].items()
                              if k != "name" and (k != "sha256" or host["kernel"].get("release") is None)}
    return repr(doc)


def _cells(runs: Iterable[RunSpec], arms: Sequence[str] | None) -> list[dict[str, RunSpec]]:
    by_cell: dict[tuple, dict[str, RunSpec]] = {}
    for spec in runs:
        arm = spec.params.get("arm")
        if arm is not None and (arms is None or arm in arms):
            by_cell.setdefault((spec.experiment, spec.cell, spec.repetition), {})[str(arm)] = spec
    return list(by_cell.values())


def identical(runs: Iterable[RunSpec], arms: Sequence[str]) -> dict[str, RunSpec] | None:
    """A cell where all `arms` ran, when in every such cell their runs are the same for the hosts; else None."""
    full = [c for c in _cells(runs, arms) if len(c) == len(arms)]
    if full and all(len({host_view(s) for s in cell.values()}) == 1 for cell in full):
        return full[0]
    return None


def why_same(arms: Sequence[str], cell: Mapping[str, RunSpec]) -> str:
    """What the profile made of the kernel variants that distinguish the arms (those the arms' params name)."""
    own = {}
    for arm in arms:
        spec = cell[arm]
        named = {str(v) for v in spec.params.values()}
        own.update({x.field.removeprefix("kernels."): x.now for x in spec.substitutions
                    if x.kind == "kernel" and x.field.removeprefix("kernels.") in named})
    nows = set(own.values())
    if not own:
        return "the profile runs them identically"
    if len(nows) == 1:
        return f"the profile gives {' and '.join(sorted(own))} the same kernel, {nows.pop()}"
    return "the profile runs them identically: " + "; ".join(f"{k} -> {v}" for k, v in sorted(own.items()))


def erased_by_profile(planned: Sequence[RunSpec], adapted: Sequence[RunSpec]) -> list[ErasedArms]:
    """Pairs of arms whose runs differ as planned (`planned`: expanded without a profile) and are the same once
    adapted (`adapted`: with it), one entry per pair, in the plan's arm order."""
    arms = list(dict.fromkeys(str(s.params["arm"]) for s in adapted if s.params.get("arm") is not None))
    out = []
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            cell = identical(adapted, (a, b))
            if cell is not None and identical(planned, (a, b)) is None:
                out.append(ErasedArms((a, b), f"arms {a} and {b} give identical runs: {why_same((a, b), cell)}"))
    return out
