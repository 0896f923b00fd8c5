"""Preflight per run (pure): can the testbed, as its agents described themselves in hello, run this RunSpec?

Each run is judged on its own, so one run the hosts cannot do (a qdisc kind or congestion control a kernel
lacks, a kernel variant a host does not run, a pitfall guard the plan did not accept) is refused and recorded
while the others run. Every reason names the host, its kernel and what is missing (engine/verify.py,
guards/pre_run.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.engine import hostchecks, verify
from orchestrator.engine.provenance import Provenance
from orchestrator.guards import pre_run
from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from schemas import protocol

REFUSED = "refused"     # the run row's status of a refused run (orchestrator/storage/run_ingest.py)


@dataclass(frozen=True)
class Runnable:
    spec: RunSpec


@dataclass(frozen=True)
class Refused:
    spec: RunSpec
    reasons: tuple[str, ...]

    @property
    def error(self) -> str:
        """The reasons as stored in the run row's `error`."""
        return "refused before touching any host: " + "; ".join(self.reasons)


Verdict = Runnable | Refused


def check_run(spec: RunSpec, caps: dict[str, protocol.Capabilities], inv: Inventory) -> Verdict:
    """Runnable, or Refused with every reason: roles the inventory lacks, what a host's kernel or agent lacks
    (verify.capability_problems), and the pre-run guards the plan did not accept."""
    reasons = [f"host {role}: not in the inventory" for role in sorted(spec.hosts) if role not in inv.hosts]
    missing = {role for role in spec.hosts if role not in inv.hosts}
    reasons += [p for p in verify.capability_problems(spec, caps) if not any(
        p == f"host {role}: not in the testbed" for role in missing)]
    reasons += hostchecks.line_rate_problems(spec, caps, inv)
    reasons += [f"guard {f}" for f in pre_run.refusing(spec)]
    return Refused(spec, tuple(reasons)) if reasons else Runnable(spec)


def check_runs(specs: list[RunSpec], caps: dict[str, protocol.Capabilities], inv: Inventory) -> list[Verdict]:
    return [check_run(s, caps, inv) for s in specs]


def spec_columns(spec: RunSpec, plan_row: dict | None, tags: list[str], provenance: Provenance = Provenance()) -> dict:
    """The columns of a run row that come from the RunSpec (and its plan, testbed and provenance), whatever the
    outcome."""
    return {**provenance.columns(plan_row["path"] if plan_row else None),
        "run_id": spec.run_id, "plan_sha256": plan_row["plan_sha256"] if plan_row else None,
        "plan_name": spec.plan_name, "experiment": spec.experiment, "repetition": spec.repetition,
        "seed": spec.seed, "params": spec.params, "derived": spec.derived.model_dump(mode="json"),
        "spec": spec.model_dump(mode="json"), "tags": sorted(set(spec.tags) | set(tags)),
        "profile": spec.profile.name if spec.profile else None, "duration_s": spec.duration_s,
    }


def refused_row(v: Refused, plan_row: dict | None, tags: list[str], at, provenance: Provenance = Provenance()) -> dict:
    """The run row of a refused run: status `refused`, the reasons in `error`, no T0 (nothing ran)."""
    return {**spec_columns(v.spec, plan_row, tags, provenance), "status": REFUSED, "t0_ns": None, "started_at": at,
            "finished_at": at, "error": v.error, "flags": []}
