"""`tcplab campaign run|resume` (effects): one night of a campaign, resumable.

Take the campaign's lease (storage/lease.py) -> start a night, or finish the open one -> put trials a killed
manager left `running` back to `pending` -> connect the testbed and let engine recovery finish runs it left on
disk (their trials settle when their runs are stored) -> rounds: add the trials the night still needs
(schedule.py: ABBA, retries), run every pending one in order (preflight: refused, else run and store — the run's
write settles its trial in the same transaction), compute their metric values, decide, and add repetitions where
a cell is INCONCLUSIVE -> verdicts, trends, exit code. The lease is renewed between trials.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from sqlalchemy import Engine

from analysis.compare import run_metric_values
from orchestrator.agent_client import AgentError
from orchestrator.campaign import schedule, verdicts
from orchestrator.campaign.cells import trial_seed
from orchestrator.campaign.loader import LoadedCampaign
from orchestrator.engine import provenance
from orchestrator.engine.kernel_builds import attach_builds
from orchestrator.engine.preflight import Refused
from orchestrator.engine.recovery import AnotherManager, recover
from orchestrator.engine.runner import PENDING, RunEngine, RunOutcome
from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from orchestrator.plan.checks.profile_loader import load_profile
from orchestrator.plan.expansion.adapt import effective_kernels
from orchestrator.storage import lease, trials
from orchestrator.storage.campaign_tables import campaign_verdict
from orchestrator.storage.db import writer

log = logging.getLogger("tcplab.campaign")
MAX_ROUNDS = 64      # rounds of "run what is pending, decide, add repetitions" per night (each adds ≥ 1 per side)


class CampaignBusy(Exception):
    """Another manager holds the campaign's lease."""


@dataclass
class NightResult:
    night: dict
    rows: list[verdicts.VerdictRow]
    exit_code: int
    unfinished: list[schedule.Slot]
    overhead_s: list[float] = field(default_factory=list)


class CampaignRunner:
    def __init__(self, lc: LoadedCampaign, db: Engine, inv: Inventory, results: Path, console: Console,
                 progress_factory, strict: bool = False):
        self.lc, self.db, self.inv, self.results, self.console = lc, db, inv, results, console
        self.progress_factory, self.strict = progress_factory, strict
        self.c = lc.campaign
        self.holder = lease.me()
        self.overhead_s: list[float] = []
        self._renewed = time.monotonic()

    # --- the night ------------------------------------------------------------------------------------------

    async def run(self, resume: bool, label: str | None = None) -> NightResult:
        if (other := lease.acquire(self.db, self.c.name, self.holder)) is not None:
            raise CampaignBusy(f"campaign {self.c.name} is run by {other.name} (lease until "
                               f"{other.expires_at:%Y-%m-%d %H:%M:%S} UTC)")
        try:
            trials.save_campaign(self.db, self.c.name, self.lc.sha256, str(self.lc.path), self.lc.text)
            night = trials.open_night(self.db, self.c.name)
            if night is None and resume:
                raise LookupError(f"campaign {self.c.name} has no unfinished night to resume")
            if night is None:
                night = trials.start_night(self.db, self.c.name, self.lc.sha256, label)
                self.console.print(f"campaign {self.c.name}: night {night['night']} ({night['label']})", markup=False)
            else:
                back = trials.requeue_running(self.db, night["id"])
                self.console.print(f"campaign {self.c.name}: resuming night {night['night']} ({night['label']})"
                                   + (f"; {back} trials left running by a stopped manager are pending again"
                                      if back else ""), markup=False)
            return await self._night(night)
        finally:
            lease.release(self.db, self.c.name, self.holder)

    async def _night(self, night: dict) -> NightResult:
        engine = RunEngine(self.inv, self.db, self.results,
                           provenance=provenance.collect(self.inv.kind, [p.row["path"] for p in self.lc.plans]))
        await engine.connect_all()    # AgentError: an unreachable host, before anything is touched
        async with engine:
            try:
                for outcome in await recover(engine):
                    self.console.print(f"recovered run {outcome.run_id}: {outcome.status}", markup=False)
            except AnotherManager as exc:
                raise CampaignBusy(str(exc)) from None
            rows: list[verdicts.VerdictRow] = []
            targets = self._initial_targets(night)
            for _ in range(MAX_ROUNDS):
                self._add_trials(night, targets)
                await self._run_pending(engine, night)
                self._measure(night)
                rows = self._judge(night)
                more = verdicts.extra_repetitions(self.c, rows, self._ok_counts(night))
                if not more:
                    break
                for cell, k in more.items():
                    for v in self._variants_tonight(cell):
                        targets[(cell, v)] = targets.get((cell, v), 0) + k
                self.console.print(f"{len(more)} cells inconclusive: {max(more.values())} more repetitions each "
                                   "(ABBA)", markup=False)
        tonight = trials.trials(self.db, [night["id"]])
        unfinished = schedule.unfinished(tonight, self.c.repetitions.attempts)
        code = verdicts.exit_code(rows, len(unfinished), self.strict)
        self._store_verdicts(night["id"], rows)
        summary = {"verdicts": {v: sum(1 for r in rows if r.verdict == v) for v in {r.verdict for r in rows}},
                   "trials": {s: sum(1 for t in tonight if t["status"] == s) for s in {t["status"] for t in tonight}},
                   "unfinished": [list(s) for s in unfinished], "overhead_s": self.overhead_s}
        trials.finish_night(self.db, night["id"], code, summary)
        return NightResult(night, rows, code, unfinished, self.overhead_s)

    # --- trials ---------------------------------------------------------------------------------------------

    def _history_ids(self, night: dict) -> list[int]:
        done = [n["id"] for n in trials.nights(self.db, self.c.name)
                if n["status"] == "done" and n["id"] != night["id"]]
        return done + [night["id"]]

    def _variants_tonight(self, cell_key: str) -> list[str]:
        """With `baseline.nights`, the baseline runs tonight only where its recent nights hold too few samples."""
        names = list(self.c.variants)
        if self.c.baseline.nights is None:
            return names
        return [v for v in names if v != self.c.baseline.variant] + (
            [self.c.baseline.variant] if cell_key in self._short_baseline else [])

    def _initial_targets(self, night: dict) -> dict[tuple[str, str], int]:
        self._short_baseline: set[str] = set()
        if self.c.baseline.nights is not None:
            ids = self._history_ids(night)[:-1][-self.c.baseline.nights:]
            old = [t for t in trials.trials(self.db, ids)
                   if t["status"] == "ok" and t["variant"] == self.c.baseline.variant]
            have = {cell.key: sum(1 for t in old if t["cell_key"] == cell.key) for cell in self.lc.cells}
            self._short_baseline = {k for k, n in have.items() if n < self.c.repetitions.min}
        return {(cell.key, v): self.c.repetitions.min
                for cell in self.lc.cells for v in self._variants_tonight(cell.key)}

    def _add_trials(self, night: dict, targets: dict[tuple[str, str], int]) -> None:
        existing = trials.trials(self.db, [night["id"]])
        top = max(targets.values(), default=0)
        seeds = {(cell.key, r): trial_seed(self.c.seed, cell.key, r) for cell in self.lc.cells for r in range(top)}
        rows = schedule.new_trials(self.c.name, night["id"], night["night"], self.lc.cells, list(self.c.variants),
                                   targets, existing, self.c.repetitions.attempts, seeds,
                                   {p.index: p.row["plan_sha256"] for p in self.lc.plans})
        trials.add_trials(self.db, self._with_builds(rows))

    def _with_builds(self, rows: list[dict]) -> list[dict]:
        """Trials of a built source variant expect that build's release and record its key (engine/kernel_builds):
        attached once per plan and variant (pinning a source variant hashes its inputs)."""
        plan_of = {c.key: c.plan_index for c in self.lc.cells}
        sources = {p.index: p for p in self.lc.plans}
        groups: dict[tuple[int, str], list[dict]] = {}
        for r in rows:
            groups.setdefault((plan_of[r["cell_key"]], r["variant"]), []).append(r)
        specs: dict[str, dict] = {}
        for (plan_index, variant), group in groups.items():
            source = sources[plan_index]
            profile = load_profile(source.profile_path) if source.profile_path else None
            kernels = effective_kernels(source.kernels.get(variant, {}), profile, str(source.path.parent.resolve()))
            built, _ = attach_builds([RunSpec.model_validate(r["spec"]) for r in group], kernels, source.path.parent)
            specs.update({s.run_id: s.model_dump(mode="json") for s in built})
        return [{**r, "spec": specs[r["run_id"]]} for r in rows]

    def _plan_row(self, plan_sha: str) -> dict:
        p = next(p for p in self.lc.plans if p.row["plan_sha256"] == plan_sha)
        return {**p.row, "created_at": dt.datetime.now(dt.UTC)}

    async def _run_pending(self, engine: RunEngine, night: dict) -> None:
        """Every pending trial of the night in order: the refused ones recorded as such, the others through
        `run_many` (each run's ingest overlapped with the next run where that is safe: engine/pipeline.py)."""
        pending = [t for t in trials.trials(self.db, [night["id"]]) if t["status"] == "pending"]
        jobs, by_run = [], {}
        for t in pending:
            spec = RunSpec.model_validate(t["spec"])
            verdict = engine.preflight([spec])[0]
            if isinstance(verdict, Refused):
                outcome = await engine.record_refused(verdict, self._plan_row(t["plan_sha256"]))
                self.console.print(f"trial {spec.run_id} refused: {verdict.error}", style="yellow", markup=False)
                if outcome.status == PENDING:
                    trials.mark_unsettled(self.db, t["id"], "infra-error", outcome.error)
            elif trials.mark_running(self.db, t["id"], self.holder):
                jobs.append((spec, self._plan_row(t["plan_sha256"])))
                by_run[spec.run_id] = t
        if not jobs:
            return
        with self.progress_factory() as progress:
            bar = progress.add_task(f"{self.c.name} night {night['night']}", total=len(jobs), phase="")
            engine.on_phase = lambda run_id, phase: progress.update(bar, phase=f"{run_id}: {phase}")

            def stored(outcome: RunOutcome) -> None:
                t = by_run[outcome.run_id]
                overhead = outcome.timing.overhead_s if outcome.timing is not None else math.nan
                self.overhead_s.append(round(overhead, 3))
                self.console.print(f"trial {outcome.run_id}: {outcome.status}, overhead {overhead:.2f} s"
                                   + (f" ({outcome.error})" if outcome.error else ""), markup=False)
                if outcome.status == PENDING:   # the run is on disk, the database did not take it
                    trials.mark_unsettled(self.db, t["id"], "infra-error", outcome.error)
                self._keep_lease()
                progress.advance(bar)

            try:
                await engine.run_many(jobs, on_outcome=stored)
            except AgentError as exc:
                for t in by_run.values():     # what never ran is an infrastructure error, tried again next round
                    trials.mark_unsettled(self.db, t["id"], "infra-error", str(exc))

    def _keep_lease(self) -> None:
        if time.monotonic() - self._renewed > lease.LEASE_S / 4:
            if not lease.renew(self.db, self.c.name, self.holder):
                raise CampaignBusy(f"campaign {self.c.name}: the lease was taken over while this manager ran")
            self._renewed = time.monotonic()

    # --- values and verdicts --------------------------------------------------------------------------------

    def _measure(self, night: dict) -> None:
        """One value per metric for every ok trial that has none yet (the run analysed once)."""
        tonight = [t for t in trials.trials(self.db, [night["id"]]) if t["status"] == "ok"]
        have = trials.metrics(self.db, [t["id"] for t in tonight])
        todo = {t["run_id"]: t["id"] for t in tonight if t["id"] not in have}
        if todo:
            values = run_metric_values(self.db, list(todo))
            trials.save_metrics(self.db, {todo[r]: v for r, v in values.items()})

    def _ok_counts(self, night: dict) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for t in trials.trials(self.db, [night["id"]]):
            if t["status"] == "ok":
                out[(t["cell_key"], t["variant"])] = out.get((t["cell_key"], t["variant"]), 0) + 1
        return out

    def history(self, night: dict) -> verdicts.History:
        ids = self._history_ids(night)
        all_trials = trials.trials(self.db, ids)
        values = trials.metrics(self.db, [t["id"] for t in all_trials if t["status"] == "ok"])
        return verdicts.History(all_trials, values, ids, night["id"])

    def _judge(self, night: dict) -> list[verdicts.VerdictRow]:
        return verdicts.judge(self.c, self.lc.cells, self.history(night))

    def _store_verdicts(self, night_id: int, rows: list[verdicts.VerdictRow]) -> None:
        def clean(obj):   # JSON has no NaN
            if isinstance(obj, float) and not math.isfinite(obj):
                return None
            if isinstance(obj, dict):
                return {k: clean(v) for k, v in obj.items()}
            if isinstance(obj, list | tuple):
                return [clean(v) for v in obj]
            return obj

        with writer(self.db).begin() as conn:
            conn.execute(campaign_verdict.delete().where(campaign_verdict.c.campaign_run_id == night_id))
            if rows:
                conn.execute(campaign_verdict.insert(), [
                    {"campaign_run_id": night_id, "check_index": r.check_index, "cell_key": r.cell_key,
                     "variant": r.variant, "metric": r.metric, "kind": r.kind, "verdict": r.verdict,
                     "detail": clean({**r.detail, "cell_label": r.cell_label})} for r in rows])
