"""The campaign file (docs/campaigns.md): plans (with profiles) × variants × repetitions, the vanilla baseline and
the declared checks. A pydantic model like the plan's: unknown fields are errors, every field documented with an
example (`schemas/campaign.schema.json` is generated from it), every problem reported as FILE:LINE:COL.

A **variant** is what a campaign compares: a kernel (a plan-style kernel variant booted on some roles) and/or
overrides of the plan's run template (`bottleneck.queue.limit: 1000`). Everything else is the **cell**: plan,
experiment, arm, matrix values and profile. The baseline variant must name a vanilla kernel (G-BASELINE).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, model_validator

from analysis.stats.defaults import ALPHA, MAX_REPS, MIN_REPS
from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.kernels import KernelVariant
from orchestrator.plan.model.names import RoleName, VariantName

CampaignName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")]
MAX_PLANS = 32
MAX_VARIANTS = 8
MAX_CHECKS = 64
MAX_REPETITIONS = 50
MAX_OVERRIDES = 32


class PlanEntry(Strict):
    """One plan of the campaign, adapted to the testbed by its profile, optionally narrowed."""

    plan: str = _f(..., "the plan file, relative to the campaign file", "../quickstart.yaml",
                   min_length=1, max_length=400)
    profile: str | None = _f(None, "a testbed profile, relative to the campaign file", "../profiles/netns-lab.yaml",
                             max_length=400)
    experiments: list[str] = _f([], "only these experiments of the plan (default: all)", ["e1"], max_length=64)
    arms: list[str] = _f([], "only these arms (default: all)", ["reno-ramp"], max_length=64)
    cells: int | None = _f(None, "at most this many cells of the plan, in run order (a smoke campaign)", 2,
                           ge=1, le=10_000)


class Variant(Strict):
    """What a campaign compares: a kernel on some roles and/or overrides of every plan's run template."""

    description: str = _f("", "what the variant is", "tonight's net-next build")
    kernel: KernelVariant | None = _f(None, "the kernel the roles boot (a plan kernel variant); a candidate without "
                                      "one runs the baseline's kernel", {"vanilla": True,
                                                                         "package": "linux-image-6.1.0-*-amd64"})
    roles: list[RoleName] = _f([], "roles that boot the kernel (default: every role of the plan)", ["sender"],
                               max_length=32)
    overrides: dict[str, Any] = _f({}, "run-template fields this variant sets, as a matrix axis names them",
                                   {"bottleneck.queue.limit": 1000}, max_length=MAX_OVERRIDES)


class Baseline(Strict):
    """The vanilla baseline: a variant run beside the candidates (interleaved), or its samples of the last nights."""

    variant: VariantName = _f(..., "the baseline variant; its kernel must be vanilla (G-BASELINE)", "vanilla")
    nights: int | None = _f(None, "take the baseline's samples from its last N nights of this campaign instead of "
                            "running it every night (it runs tonight only where those nights hold too few)", 5,
                            ge=1, le=60)


class Repetitions(Strict):
    # the defaults bench/campaign_stats.py measured (docs/statistics.md): decide a 5 % change at 6 + 6 where the
    # netns lab's run-to-run noise allows, give noisier checks up to 12 per side
    min: int = _f(MIN_REPS, "repetitions per side before any verdict", MIN_REPS, ge=2, le=MAX_REPETITIONS)
    max: int = _f(MAX_REPS, "at most this many per side; INCONCLUSIVE cells get 2 more per look up to here (ABBA "
                  "order)", MAX_REPS, ge=2, le=MAX_REPETITIONS)
    attempts: int = _f(2, "tries per trial: a failed run is tried again up to this many times", 2, ge=1, le=5)

    @model_validator(mode="after")
    def _ordered(self) -> Repetitions:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class Check(Strict):
    """A declared check: a metric of every cell judged against the baseline, a bound, or its own past nights."""

    metric: str = _f(..., "a metric key (docs/campaigns.md lists them with their unit and better direction)",
                     "goodput", pattern=r"^[a-z][a-z0-9_]{0,39}$")
    kind: Literal["relative", "absolute", "trend"] = _f(
        "relative", "relative: candidate vs baseline (ratio of medians); absolute: the candidate's median vs "
        "`bound`; trend: the candidate's nightly medians, change-point detection", "relative")
    better: Literal["higher", "lower"] | None = _f(
        None, "only for a metric that declares no direction (e.g. cwnd_mean); others declare theirs once", "lower")
    min_effect: float | None = _f(None, "the smallest relative change that matters (0.02 = 2 %); default by the "
                                  "metric's kind: 2 % throughput, 2.5 % delay and fairness, 10 % counts", 0.02,
                                  gt=0, lt=1)
    alpha: float = _f(ALPHA, "false-discovery rate across the campaign's checks (Benjamini-Hochberg); each verdict "
                      "is a one-sided test at this level", 0.05, gt=0, lt=0.5)
    bound: float | None = _f(None, "absolute: the bound, in the metric's unit", 20.0)
    variants: list[VariantName] = _f([], "the candidate variants checked (default: every non-baseline one)",
                                     ["tonight"], max_length=MAX_VARIANTS)

    @model_validator(mode="after")
    def _bound(self) -> Check:
        if (self.kind == "absolute") != (self.bound is not None):
            raise ValueError("`bound` is given with kind absolute, and only then")
        return self


class Campaign(Strict):
    """A nightly campaign: plans × variants × repetitions with declared checks (docs/campaigns.md)."""

    version: Literal[1] = _f(..., "campaign file format", 1)
    name: CampaignName = _f(..., "campaign name (the database key of its history)", "nightly-netns")
    description: str = _f("", "what the campaign watches", "DCTCP latecomer fairness, nightly")
    plans: list[PlanEntry] = Field(..., min_length=1, max_length=MAX_PLANS, description="the plans run each night",
                                   examples=[[{"plan": "../quickstart.yaml"}]])
    variants: dict[VariantName, Variant] = Field(..., min_length=2, max_length=MAX_VARIANTS,
                                                 description="the baseline and the candidates",
                                                 examples=[{"vanilla": {"kernel": {"vanilla": True,
                                                                                   "package": "linux-image-6.1.0-*"
                                                                                              "-amd64"}},
                                                            "tonight": {"overrides": {"bottleneck.rate": "40mbit"}}}])
    baseline: Baseline = _f(..., "the vanilla baseline", {"variant": "vanilla"})
    repetitions: Repetitions = _f(Repetitions(), "repetitions per cell and side", {"min": 4, "max": 8})
    checks: list[Check] = Field(..., min_length=1, max_length=MAX_CHECKS, description="what is judged",
                                examples=[[{"metric": "goodput"}, {"metric": "qdelay_p99", "min_effect": 0.05}]])
    seed: int = _f(1, "seed of the bootstrap and the permutation tests (verdicts are reproducible)", 1, ge=0,
                   le=2**32 - 1)

    @property
    def candidates(self) -> list[str]:
        return [v for v in self.variants if v != self.baseline.variant]

    def checked_variants(self, check: Check) -> list[str]:
        return list(check.variants) or self.candidates
