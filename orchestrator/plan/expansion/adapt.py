"""Applying a testbed profile (model/profile.py) to a checked plan: pure, every change recorded.

Three adaptations, each a `Substitution` stored with the runs it touches:
- kernels: the first rule whose glob matches a variant's name replaces its origin. A variant with patches or
  config fragments of its own becomes a build of the rule's Debian source package with the same patches,
  fragments and modules; any other variant becomes the rule's distribution package plus its modules; a `build`
  rule puts the variant another plan file declares in its place (a study's mechanism carried onto the
  testbed's kernel), its file paths made relative to the plan's directory. The
  name stays (it is how arms and `--kernel` name it); the hash follows the new content (G-VARIANT).
- rates: one factor per experiment, so a sweep keeps its ratios (and the arms of an experiment stay
  comparable), while a 9 Gbit/s experiment of a plan does not slow its 10 Mbit/s ones down 200-fold too.
  With `keep: bdp` every time of the
  path (netem delays, base RTT, AQM targets, intervals and thresholds written as times, buffers written as
  times) grows by 1/factor: the path is the study's, slowed down, and holds the same packets. Flow start
  times, durations and sampling intervals are the plan's. With `keep: delay` only the rates change.
- captures: points on a `move_off` host move to the other end of the same link (kept, and said so, when
  that end is a switch or must not capture either); snaplen is capped.
The profile runs on each cell's run template before its values are derived, so BDPs, RED thresholds, htb
bursts and netem limits follow the adapted values.
"""
from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from orchestrator.plan.expansion.build import default_capture_points
from orchestrator.plan.expansion.canon import digest
from orchestrator.plan.expansion.runspec import Substitution
from orchestrator.plan.model import units
from orchestrator.plan.model.kernels import KernelSource, KernelVariant
from orchestrator.plan.model.paths import KeyPath, set_in
from orchestrator.plan.model.profile import KernelRule, Profile, Scaling
from orchestrator.plan.model.quantities import Buffer, Quantity, Rate, Threshold, Time
from orchestrator.plan.model.template import RunTemplate
from orchestrator.plan.model.topology import Graph

PATH_TIME_ROOTS = ("bottleneck", "base_rtt")


def profile_digest(profile: Profile) -> str:
    """What the profile does, hashed (its description is not): part of the key of every run it adapts."""
    return digest(profile.model_dump(mode="json", exclude={"description"}))


# ------------------------------------------------------------------ kernels

RUNNING = "the kernel the host runs (recorded per run)"


def _matches(name: str, v: KernelVariant, rule: KernelRule) -> bool:
    return fnmatch.fnmatchcase(name, rule.match) and rule.vanilla in (None, v.vanilla)


def rebased(variant: KernelVariant, files_dir: str, plan_dir: str | None) -> KernelVariant:
    """`variant` (its patches, fragments, modules and tarball relative to files_dir) with those paths relative to
    the plan's directory, where every kernel file field of a plan is read from; absolute for a plan read from
    text. Pure: paths are joined, not looked up."""
    def move(p: str) -> str:
        full = os.path.normpath(os.path.join(files_dir, p))
        return os.path.relpath(full, plan_dir) if plan_dir is not None else full

    src = variant.source
    assert src is not None
    moved = src.model_copy(update={"patches": [move(p) for p in src.patches], "config": [move(c) for c in src.config],
                                   "tarball": move(src.tarball) if src.tarball else None})
    return variant.model_copy(update={"source": moved, "modules": [move(m) for m in variant.modules]})


def _substitute(v: KernelVariant, rule: KernelRule, plan_dir: str | None) -> KernelVariant | None:
    if rule.stand_in is not None:
        stand_in, files_dir = rule.stand_in
        return rebased(stand_in, files_dir, plan_dir).model_copy(
            update={"description": v.description, "vanilla": v.vanilla})
    if v.patched:
        if rule.source is None:
            return None
        src = v.source
        assert src is not None
        return KernelVariant(description=v.description, vanilla=v.vanilla, modules=v.modules,
                             source=KernelSource(package=rule.source, patches=src.patches, config=src.config,
                                                 localversion=src.localversion))
    if rule.package is not None:
        return KernelVariant(description=v.description, vanilla=v.vanilla, package=rule.package, modules=v.modules)
    return KernelVariant(description=v.description, vanilla=v.vanilla, modules=v.modules,
                         source=KernelSource(package=rule.source))


def _origin(v: KernelVariant) -> str:
    if v.package is not None:
        return f"package {v.package}"
    assert v.source is not None
    base = f"source {v.source.package}" if v.source.package else f"source {v.source.git} {v.source.ref}"
    extras = [f"{len(v.source.patches)} patch(es)"] * bool(v.source.patches)
    extras += [f"{len(v.source.config)} config fragment(s)"] * bool(v.source.config)
    return base + (f" + {', '.join(extras)}" if extras else "")


def effective_kernels(kernels: dict[str, KernelVariant], profile: Profile | None,
                      plan_dir: str | None = None) -> dict[str, KernelVariant]:
    """The variants a plan's runs ask for on a testbed: the plan's, substituted by the profile if any
    (`plan_dir`: Plan.source_dir, which a stand-in's file paths are made relative to)."""
    return kernels if profile is None else adapt_kernels(kernels, profile.kernels, plan_dir)[0]


def adapt_kernels(kernels: dict[str, KernelVariant], rules: list[KernelRule], plan_dir: str | None = None
                  ) -> tuple[dict[str, KernelVariant], dict[str, Substitution]]:
    """The plan's variants with the profile's substitutions, and the substitution made for each name. A
    variant the running kernel stands in for leaves the map: its hosts then need no particular kernel. A
    `build` rule's variant must have been read by the profile loader (KernelRule.stand_in)."""
    out, subs = dict(kernels), {}
    for name, v in kernels.items():
        rule = next((r for r in rules if _matches(name, v, r)), None)
        if rule is None:
            continue
        if rule.running:
            del out[name]
            subs[name] = Substitution(kind="kernel", field=f"kernels.{name}", was=_origin(v), now=RUNNING,
                                      why=rule.why)
            continue
        if rule.build is not None and rule.stand_in is None:
            raise ValueError(f"kernel rule for {rule.match!r}: its `build` variant was not read (load the profile "
                             "with load_profile)")
        new = _substitute(v, rule, plan_dir)
        if new is None:
            continue
        out[name] = new
        now = _origin(new) if rule.build is None else \
            f"variant {rule.build.variant} of {rule.build.plan} ({_origin(new)})"
        subs[name] = Substitution(kind="kernel", field=f"kernels.{name}", was=_origin(v), now=now, why=rule.why)
    return out, subs


# ------------------------------------------------------------------ rates and times

def quantities(obj: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Quantity]]:
    """Every quantity in a run template with its key path (models, maps and lists walked)."""
    if isinstance(obj, Quantity):
        yield path, obj
    elif isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            yield from quantities(getattr(obj, name), path + (name,))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from quantities(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from quantities(v, path + (i,))


def on_path(path: KeyPath) -> bool:
    """A time of the network path (scaled with `keep: bdp`), not of the run (flow starts, durations, polls)."""
    return (path[0] in PATH_TIME_ROOTS or (path[0] == "hosts" and "qdiscs" in path)
            or (path[0] == "events" and path[-1] == "delay"))


def plan_rate_bit(runs: list[RunTemplate]) -> int | None:
    """The largest rate any run sends or shapes at (an interface's line rate is not traffic)."""
    rates = [q.value for r in runs for p, q in quantities(r) if isinstance(q, Rate) and p[-1] != "line_rate"]
    return max(rates, default=None)


def readable_factor(limit: float) -> float:
    """The largest 1, 2 or 5 x 10^k not above `limit` (<= 1): 600 Mbit/s under a 50 Mbit/s cap scales by
    0.05, not 0.0833, so the scaled values read as plainly as the study's (30mbit, 6ms)."""
    if limit >= 1.0:
        return 1.0
    exp = math.floor(math.log10(limit))
    for m in (5, 2, 1):
        f = m * 10.0 ** exp
        if f <= limit * (1 + 1e-12):
            return float(f"{f:.12g}")
    return float(f"{10.0 ** exp:.12g}")


def scale_factor(scaling: Scaling | None, runs: list[RunTemplate]) -> float:
    """The rate factor of these runs (one experiment's): as given, or max_rate over their largest rate made
    readable."""
    if scaling is None:
        return 1.0
    if scaling.factor is not None:
        return scaling.factor
    top = plan_rate_bit(runs)
    assert scaling.max_rate is not None
    return 1.0 if not top else readable_factor(scaling.max_rate.value / top)


def _scaled(path: KeyPath, q: Quantity, factor: float, keep: str) -> str | None:
    """The new spelling of a quantity, or None when it stays."""
    if isinstance(q, Rate):
        return units.format_rate(max(1, round(q.value * factor)))
    if keep != "bdp" or not on_path(path):
        return None
    if isinstance(q, Time):
        return units.format_time_ns(round(q.value / factor)) if q.value else None
    if isinstance(q, (Threshold, Buffer)) and q.value[0] == "ns":
        return units.format_time_ns(round(q.value[1] / factor))
    return None


def dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


def scale_run(run: RunTemplate, factor: float, keep: str) -> tuple[RunTemplate, list[Substitution]]:
    if factor >= 1.0:
        return run, []
    doc, subs = run.model_dump(mode="json"), []
    why = f"x{factor:.6g}" + (" (keep bdp: path times x1/factor)" if keep == "bdp" else " (keep delay)")
    for path, q in quantities(run):
        new = _scaled(path, q, factor, keep)
        if new is not None and new != str(q.raw):
            doc = set_in(doc, path, new)
            kind = "rate" if isinstance(q, Rate) else "time"
            subs.append(Substitution(kind=kind, field=dotted(path), was=str(q.raw), now=new, why=why))
    return RunTemplate.model_validate(doc), subs


# ------------------------------------------------------------------ captures

def place_captures(run: RunTemplate, profile: Profile, graph: Graph) -> tuple[RunTemplate, list[Substitution]]:
    placement = profile.captures
    if placement is None or run.captures == []:
        return run, []
    points = ([(c.host, c.toward, c.snaplen.value) for c in run.captures] if run.captures is not None else
              [(p.link.host, p.link.toward, p.snaplen) for p in default_capture_points(run)])
    out, subs, cap = [], [], placement.snaplen.value if placement.snaplen else None
    for host, toward, snaplen in points:
        where = f"{host}:to-{toward}"
        if host in placement.move_off:
            if toward in graph.hosts and toward not in placement.move_off:
                subs.append(Substitution(kind="capture", field=where, was=where, now=f"{toward}:to-{host}",
                                         why=f"{host} must not capture: the other end of the link"))
                host, toward = toward, host
            else:   # the other end is a switch, or must not capture either: better the plan's point than none
                subs.append(Substitution(kind="capture", field=where, was=where, now=where,
                                         why=f"kept: {host} must not capture, but {toward} cannot take it over"))
        if cap is not None and snaplen > cap:
            subs.append(Substitution(kind="capture", field=f"{host}:to-{toward}.snaplen", was=str(snaplen),
                                     now=str(cap), why="profile snaplen"))
            snaplen = cap
        if (host, toward, snaplen) not in out:
            out.append((host, toward, snaplen))
    doc = {**run.model_dump(mode="json"), "captures": [{"host": h, "toward": t, "snaplen": s} for h, t, s in out]}
    return RunTemplate.model_validate(doc), subs


@dataclass(frozen=True)
class Adaptation:
    """A profile made concrete for one plan: its kernels, its rate factor, and how to adapt one run."""

    profile: Profile
    sha256: str
    kernels: dict[str, KernelVariant]
    kernel_subs: dict[str, Substitution]
    factors: dict[str, float]   # experiment -> its rate factor
    graph: Graph

    def run(self, run: RunTemplate, experiment: str) -> tuple[RunTemplate, list[Substitution]]:
        keep = self.profile.scale.keep if self.profile.scale else "bdp"
        run, scaled = scale_run(run, self.factors[experiment], keep)
        run, placed = place_captures(run, self.profile, self.graph)
        return run, scaled + placed

    def kernel_substitutions(self, variant_names: set[str]) -> list[Substitution]:
        return [self.kernel_subs[n] for n in sorted(variant_names) if n in self.kernel_subs]


def adaptation(profile: Profile, kernels: dict[str, KernelVariant], runs: list[tuple[str, RunTemplate]],
               graph: Graph, plan_dir: str | None = None) -> Adaptation:
    """`runs`: (experiment, run template) of every cell; each experiment gets the factor its own runs need."""
    adapted, subs = adapt_kernels(kernels, profile.kernels, plan_dir)
    by_experiment: dict[str, list[RunTemplate]] = {}
    for experiment, run in runs:
        by_experiment.setdefault(experiment, []).append(run)
    factors = {e: scale_factor(profile.scale, rs) for e, rs in by_experiment.items()}
    return Adaptation(profile, profile_digest(profile), adapted, subs, factors, graph)
