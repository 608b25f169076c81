"""What each stage of an iteration returns: small, frozen, JSON-serialisable records.

Paths point at Parquet shards or checkpoint directories; the rest are counts, timings and
metrics. Prefect persists and replays these (as JSON) after a crash; the flow passes them on
and tracking and the Prefect artifacts read their fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from trace_core.home.shards import shard_error


class StageResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    outputs: ClassVar[tuple[str, ...]] = ()  # fields holding the paths the stage wrote

    seconds: float = Field(0.0, description="Wall seconds of the stage's work (shard writes included).")


class FitReport(BaseModel):
    """What one predictor refresh did (``Predictor.fit`` returns it; ``trace_core.predictor``
    re-exports it). The sub-reports are the fitted parts' own plain-data summaries."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_labelled: int  # labelled nodes offered
    n_roots: int
    n_prefixes: int
    n_train: int  # nodes the head was trained on (roots and raw prefixes, after the cap)
    n_calib: int  # held-out nodes used for calibration
    iterations: list[int]  # distinct iterations among the labelled nodes
    seconds: float
    fallback: bool  # True when too little data for the head: predictions are the prior
    warm_start: bool
    train_loss: float | None = None
    calib: dict[str, dict[str, float | str]] = Field(default_factory=dict)  # kind -> {n, method, brier_before/after}
    history_prompts: int = 0  # prompts with a record in the prior
    steps: int = 0  # optimiser steps of the head
    batch_size: int = 0
    prior: dict[str, int | float] = Field(default_factory=dict)  # kappa_cell, kappa_prompt, prior_units, cell_prior_cells
    flip: dict[str, bool | int | float] = Field(default_factory=dict)  # continuations, logistic


class PredictorFit(StageResult):
    """Stage 1: the refreshed predictor's state file and its fit report."""

    outputs = ("path",)
    path: str
    fit: FitReport
    outcome_version: int | None = None  # newest policy version among the outcomes it was fitted on


class RootAllocation(StageResult):
    """Stage 2: the prompts shard (candidates with ``v_pred`` and ``m_alloc``)."""

    outputs = ("prompts",)
    prompts: str
    candidates: int
    active: int
    root_budget_used: int
    expected_contrastive: float
    expected_effective: float = 0.0
    root_budget: int = 0  # first-wave raw rollouts offered (the rest is the continuation reserve)
    threshold: float = 0.0  # the roots' price: continuations must beat it (trace, one price)
    budget: int = 0  # trajectories this iteration may generate (planner.iteration_budget; 0: budget_total)
    oracle_tokens: int = 0  # the oracle bound's sampling (predictor.oracle_samples): not in the budget


class Generation(StageResult):
    """Stages 3 and 5: generated nodes (raw rollouts or continuations)."""

    outputs = ("path",)
    path: str
    trajectories: int
    tokens: int
    tokens_per_s: float


class PrefixAllocation(StageResult):
    """Stage 4: the planner's K per open prefix of the raw rollouts and its second root wave."""

    outputs = ("path", "refill_prompts")
    path: str
    prefixes: int
    ext_budget: int
    ext_used: int
    branched: int
    refill_prompts: str | None = None  # the second root wave: m per candidate, generated in stage 5
    refill_rollouts: int = 0
    oracle_tokens: int = 0  # the oracle bound's continuations (predictor.oracle_samples): not in the budget
    grown: int = 0  # adaptive groups (trace.grow_first): more episodes of sampled prompts, generated in stage 5


class Extensions(Generation):
    """Stage 5: every node generated after the raw rollouts — the continuations, then the raw
    episodes the plan bought after them (``refill_trajectories`` of ``trajectories``: the second
    root wave, or the grown groups of ``trace.grow_first``; none for most strategies)."""

    continuations: int = 0
    refill_trajectories: int = 0


class Verified(StageResult):
    """Stage 6: the iteration's final node shard and the metrics measured on it."""

    outputs = ("nodes",)
    nodes: str
    trajectories: int
    effective: int
    wasted: int
    tokens: int
    effective_ratio: float
    wasted_share: float
    effective_per_1k_tokens: float
    train_reward: float
    reward_mismatches: int = 0
    confirmed_confident_share: float = 0.0  # root rollouts on prompts predicted <0.05 / >0.95 that came out so
    predictor_metrics: dict[str, float] = Field(default_factory=dict)


class UpdateStats(BaseModel):
    """What one policy update measured (``policy.update.update_policy``; the distributed update
    sums over ranks). Per-token means are over loss tokens; None: not measured (no sequence or
    no loss token; ``kl`` only with a reference, ``world_size`` / ``total_seconds`` only on torchrun)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: float = 0.0  # optimiser steps
    sequences: float = 0.0  # training sequences (trajectories)
    loss: float | None = None  # clipped surrogate (+ β·KL) per loss token
    clip_frac: float | None = None  # share of loss tokens whose ratio was clipped
    approx_kl_old: float | None = None  # k3 KL(old ‖ new) per loss token
    kl: float | None = None  # k3 KL(π ‖ π_ref) per loss token
    entropy: float | None = None  # mean -log π of the loss tokens under the policy being updated (entropy estimate)
    grad_norm: float | None = None  # mean pre-clip gradient norm per step
    loss_tokens: float | None = None  # loss tokens per epoch
    seconds: float | None = None  # the update's own wall seconds
    samples_per_s: float | None = None
    lr: float | None = None  # learning rate after the last step
    world_size: float | None = None  # torchrun ranks
    total_seconds: float | None = None  # torchrun: loading + update + checkpoint, rank 0
    is_weight: float | None = None  # off-policy correction: mean π_prox / π_behaviour per loss token (untruncated)
    is_weight_max: float | None = None  # its largest value
    is_truncated: float | None = None  # share of loss tokens whose weight was truncated at update.is_cap

    def metrics(self) -> dict[str, float]:
        """The measured statistics by field name (None left out)."""
        return self.model_dump(exclude_none=True)


class PolicyUpdate(StageResult):
    """Stage 7: the new checkpoint and the update's statistics (loss, KL, clip fraction, ...)."""

    outputs = ("checkpoint",)
    checkpoint: str
    stats: UpdateStats = Field(default_factory=UpdateStats)
    version: int = 0  # the policy version of the weights it trained (it wrote version + 1)
    staleness_mean: float = 0.0  # versions between those weights and the trajectories' (mean over leaves)
    staleness_max: int = 0
    refused: int = 0  # trajectories more than run.max_staleness versions old, not trained on

    @property
    def loss(self) -> float | None:
        return self.stats.loss


class Evaluation(StageResult):
    """Held-out accuracy (mean sampled reward), overall and per family; ``cells`` holds the
    per-(family, difficulty) success counts ``[[family, difficulty, successes, samples], ...]``."""

    accuracy: float | None = None
    by_family: dict[str, float] = Field(default_factory=dict)
    cells: list[tuple[str, int, int, int]] = Field(default_factory=list)
    episodes: int = 0
    probe_accuracy: float | None = None  # reward on ``run.probe_tasks`` training prompts
    probe_episodes: int = 0
    # mean reward per held-out prompt, in the held-out pool's order (fixed per config): two
    # evaluations of one run pair up prompt by prompt (``analysis.outcome.paired_change``)
    per_prompt: list[float] = Field(default_factory=list)

    def columns(self) -> dict[str, float]:
        """``accuracy`` and ``accuracy_<family>`` (the iterations table's columns)."""
        if self.accuracy is None:
            return {}
        return {"accuracy": self.accuracy, **{f"accuracy_{f}": v for f, v in self.by_family.items()}}


class IterationTiming(BaseModel):
    """Where one iteration's wall time went in the flow's process (``flows.train.overhead_split``):
    each stage's own work (shard writes included), the evaluation, and the rest (orchestration,
    tracking, artifacts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: dict[str, float]  # stage name (``IterationResults`` field) -> its ``seconds``
    evaluate_s: float
    iteration_s: float  # the whole iteration, wall

    @property
    def work_s(self) -> float:
        return sum(self.stages.values()) + self.evaluate_s

    @property
    def overhead_s(self) -> float:
        return max(self.iteration_s - self.work_s, 0.0)

    @property
    def overhead_share(self) -> float:
        return self.overhead_s / self.iteration_s if self.iteration_s > 0 else 0.0


def record_outputs(record: object) -> list[str]:
    """The shards, state files and checkpoint directories a stage record points at (none for
    records that are not ``StageResult``s)."""
    names = record.outputs if isinstance(record, StageResult) else ()
    return [path for name in names if (path := getattr(record, name))]


def output_problem(path: str | Path) -> str | None:
    """Why a stage output cannot be used as it is on disk ('missing', 'unreadable (...)', ...),
    or None. Parquet shards: footer and schema; directories (checkpoints): not empty."""
    p = Path(path)
    if not p.exists():
        return "missing"
    if p.is_dir():
        return None if any(p.iterdir()) else "empty directory"
    if p.suffix == ".parquet":
        why = shard_error(p)
        return None if why is None else f"unreadable ({why})"
    return None if p.stat().st_size else "empty file"


def broken_output(record: object) -> tuple[str, str] | None:
    """The first output of ``record`` that is missing or unreadable, with the reason."""
    for path in record_outputs(record):
        if (why := output_problem(path)) is not None:
            return path, why
    return None


class IterationResults(BaseModel):
    """Every stage result of one iteration, in flow order."""

    model_config = ConfigDict(frozen=True)

    predictor: PredictorFit
    roots: RootAllocation
    raw: Generation
    prefixes: PrefixAllocation
    extensions: Extensions
    verified: Verified
    update: PolicyUpdate

    def stage_seconds(self) -> dict[str, float]:
        return {name: getattr(self, name).seconds for name in type(self).model_fields}
