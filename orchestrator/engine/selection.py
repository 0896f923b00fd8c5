"""Which runs of a plan `tcplab run` takes, and in what order (pure).

Order (docs/plans.md, "Run order"): the plan's own order (`order: rounds` by default: repetition 0 of every
cell, then repetition 1, ...) is kept inside groups of runs that need the same kernel variant on every host;
the groups follow each other in the order their first run appears in the plan. A testbed that has to boot a
host into another kernel then switches once per variant set, not once per run, and the repetitions of a
group are still interleaved, so a slow drift of the testbed does not line up with one cell.

Filters (`tcplab run --experiment/--arm/--rep/--kernel/--limit`) narrow the ordered runs. Each of the first four
takes several values (repeated, or comma-separated: `--experiment 1,3A --experiment 4B`): a run matches a field
when it has any of its values, and the plan when it matches every field given. `--limit` takes the first N of
what is left, so `--limit 1` always runs the next run the full plan would have run.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan import RunSpec

KernelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RunFilter:
    """What `tcplab run` narrows the plan's runs to: any of a field's values; () or None: no narrowing."""

    experiments: tuple[str, ...] = ()
    arms: tuple[str, ...] = ()          # plan arms (`arms:`), the run id's `-<arm>` part
    repetitions: tuple[int, ...] = ()
    kernels: tuple[str, ...] = ()       # kernel variants (`kernels:`) some host of the run needs
    limit: int | None = None


def arm_of(spec: RunSpec) -> str | None:
    """The plan arm a run belongs to (expansion puts it first in the run's params), None outside arms."""
    arm = spec.params.get("arm")
    return str(arm) if arm is not None else None


def kernel_key(spec: RunSpec) -> KernelKey:
    """The kernel variants the run needs, per host that needs one: runs with the same key can follow each
    other without booting any host into another kernel. () for a run that takes whatever hosts run."""
    return tuple(sorted((role, hp.kernel.name) for role, hp in spec.hosts.items() if hp.kernel is not None))


def kernel_label(spec: RunSpec) -> str:
    """`role=variant` per host that needs a variant, for tables; '-' for none."""
    return " ".join(f"{role}={name}" for role, name in kernel_key(spec)) or "-"


def run_order(specs: list[RunSpec]) -> list[RunSpec]:
    """`specs` (in the plan's order) grouped by kernel_key, each group in the order of its first run, the plan's
    order kept inside a group. Stable: a plan with one kernel set keeps its order exactly."""
    groups: dict[KernelKey, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(kernel_key(spec), []).append(spec)
    return [spec for group in groups.values() for spec in group]


def matches(spec: RunSpec, f: RunFilter) -> bool:
    return ((not f.experiments or spec.experiment in f.experiments)
            and (not f.arms or arm_of(spec) in f.arms)
            and (not f.repetitions or spec.repetition in f.repetitions)
            and (not f.kernels or any(name in f.kernels for _, name in kernel_key(spec))))


def select_runs(specs: list[RunSpec], f: RunFilter) -> list[RunSpec]:
    """The runs of `specs` (already in run order) that match every filter, at most `f.limit` of them."""
    chosen = [s for s in specs if matches(s, f)]
    return chosen if f.limit is None else chosen[:max(f.limit, 0)]


def unknown_filter_values(specs: list[RunSpec], f: RunFilter) -> list[str]:
    """Filter values no run of the plan has: a typo that would silently select nothing is said instead."""
    have = {"experiment": {s.experiment for s in specs}, "arm": {a for s in specs if (a := arm_of(s))},
            "kernel": {name for s in specs for _, name in kernel_key(s)}}
    out = [f"--{field} {value}: the plan has no such {field} (it has: {', '.join(sorted(have[field])) or 'none'})"
           for field, values in (("experiment", f.experiments), ("arm", f.arms), ("kernel", f.kernels))
           for value in values if value not in have[field]]
    reps = {s.repetition for s in specs}
    out += [f"--rep {rep}: the plan's repetitions are {min(reps, default=0)}..{max(reps, default=0)}"
            for rep in f.repetitions if rep not in reps]
    return out


def option_values(given: list[str] | None) -> tuple[str, ...]:
    """A repeatable option's values, each occurrence possibly comma-separated, in order, without repeats."""
    return tuple(dict.fromkeys(v.strip() for one in given or () for v in one.split(",") if v.strip()))


def repetitions(text: str) -> str:
    """The type of `--rep`: comma-separated whole numbers (argparse turns the ValueError into a usage error that
    quotes the value)."""
    if not all(v.strip().isdigit() for v in text.split(",") if v.strip()):
        raise ValueError(text)
    return text
