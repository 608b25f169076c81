"""Pydantic configuration of the success predictors: one model per concern.

``PredictorConfig`` nests ``FeatureConfig`` (what a node becomes), ``ModelConfig`` (the torch
head and its step-bounded training), ``PriorConfig`` (the hierarchical Beta-Binomial prior the
head refines), ``CalibrationConfig`` (per-kind maps) and ``FlipConfig`` (continuation flips).
YAML under ``predictor:`` maps 1:1 onto it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FeatureConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hash_bits: int = Field(16, ge=8, le=22, description="Hashed n-gram space has 2**hash_bits buckets.")
    ngram_max: int = Field(2, ge=1, le=3, description="Word n-grams from 1 up to this length are hashed.")
    max_text_chars: int = Field(
        4000, ge=100, le=100_000, description="Path text is truncated to its last this many characters."
    )


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: int = Field(16, ge=0, le=1024, description="MLP hidden width; 0 gives a logistic model.")
    refine_roots: bool = Field(
        False,
        description="Let the head correct roots too. Off: roots get the calibrated prior and the head (still trained "
        "on roots and prefixes) corrects prefixes; on the tiny run and the synthetic pool the head's root "
        "correction cost AUC (0.88 -> 0.87, 0.79 -> 0.77).",
    )
    min_steps: int = Field(
        300, ge=1, le=1_000_000, description="Optimiser steps of a cold fit at least (not one step per epoch)."
    )
    warm_steps: int = Field(
        150, ge=1, le=1_000_000, description="Optimiser steps of a warm-started refresh at least."
    )
    epochs: float = Field(
        4.0, gt=0.0, le=1000.0,
        description="Passes over the training set at least (steps = max(min steps, epochs * n / batch)).",
    )
    max_steps: int = Field(3000, ge=1, le=10_000_000, description="Cap on optimiser steps per fit (bounded time).")
    batch_size: int = Field(
        256, ge=8, le=65536,
        description="Largest minibatch; the batch is sized to the data: n/16 nodes, at least min_batch_size.",
    )
    min_batch_size: int = Field(32, ge=1, le=65536, description="Smallest minibatch (nodes).")
    lr: float = Field(3e-3, gt=0.0, le=1.0, description="Adam learning rate.")
    weight_decay: float = Field(
        0.05, ge=0.0, le=1.0,
        description="Decoupled weight decay of the dense layers: keeps the head near 'no correction to the prior'.",
    )
    text_l2: float = Field(
        0.05, ge=0.0, le=10.0,
        description="L2 penalty on the hashed-text contribution (sparse table; stops it memorising prompts).",
    )
    max_train_nodes: int = Field(
        20_000, ge=100, le=10_000_000,
        description="Cap on labelled nodes per fit; the most recent iterations are kept first (bounded time).",
    )
    max_label_weight: float = Field(
        8.0, ge=1.0, le=1e6, description="A node's subtree_count weight is clipped to this (one tree, one vote)."
    )
    recency_discount: float = Field(
        0.8, gt=0.0, le=1.0, description="Training weight factor per iteration of age (the policy moves)."
    )
    min_fit_nodes: int = Field(
        20, ge=2, le=100_000, description="Below this many labelled nodes the head is skipped: the prior alone."
    )
    seed: int = Field(0, ge=0, description="Seed of the initialisation, minibatch order and the cap's subsample.")


class PriorConfig(BaseModel):
    """The hierarchical Beta-Binomial prior: trend -> (family, difficulty) cell -> prompt."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Use the prior as the head's offset (off: a constant base rate).")
    discount: float | None = Field(
        None, gt=0.0, le=1.0,
        description="Weight of an outcome per iteration of age (the policy moves; 1 = none); None = empirical "
        "Bayes: the value of discount_grid whose prequential likelihood is highest.",
    )
    discount_grid: list[float] = Field(
        [0.5, 0.7, 0.85, 1.0], min_length=1, description="Discounts tried when discount is None."
    )
    prompt_discount: float | None = Field(
        None, gt=0.0, le=1.0,
        description="Weight of a prompt's own outcome per iteration of age, apart from the cell's discount: a "
        "cell's rate moves with the policy, while a prompt that fails every episode stays out of reach until the "
        "policy reaches it (an all-failure group teaches nothing). None = the cell's discount, unless "
        "prompt_discount_grid names values to choose from by empirical Bayes.",
    )
    prompt_discount_grid: list[float] = Field(
        [], description="Prompt discounts tried, with each of discount_grid, when prompt_discount is None "
        "(empty: the cell's discount). A value below the cell's is not tried.",
    )
    cell_strength: float | None = Field(
        None, ge=0.0, le=1e6,
        description="Pseudo-count of the trend prior of a cell; None = empirical Bayes (prequential likelihood).",
    )
    prompt_strength: float | None = Field(
        None, ge=0.0, le=1e6,
        description="Pseudo-count of the cell prior of a prompt; None = empirical Bayes (Beta-Binomial likelihood).",
    )
    min_strength: float = Field(0.5, gt=0.0, le=1e6, description="Lower bound of an estimated strength.")
    max_strength: float = Field(500.0, gt=0.0, le=1e7, description="Upper bound of an estimated strength.")
    trend_c: float = Field(
        1.0, gt=0.0, le=1e6, description="Inverse L2 strength of the family x difficulty logistic trend."
    )
    siblings: bool = Field(
        True,
        description="Prefixes also count the other raw rollouts of their prompt in the same iteration that are "
        "in the frame (finished before prefixes are scored; the node's own trajectory is left out).",
    )
    window: int = Field(
        12, ge=1, le=10_000, description="Iterations of outcomes used to estimate the strengths (newest kept)."
    )
    fresh_cells: bool = Field(
        False,
        description="Two cells per (family, difficulty): a prompt never sampled is predicted from the first "
        "visits of the cell's prompts (and the held-out cell prior), a prompt with a record from their later "
        "visits -- training on a prompt raises its own rate, so a pooled cell over-predicts unseen prompts.",
    )




class ReferenceConfig(BaseModel):
    """The reference term of a root (``predictor.reference``): the policy's log-probability of the
    task's worked solution, ranked within its cell at stage 2, moves the mapped prior's logit."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        False,
        description="Score each candidate's demonstration under the current policy at stage 2 (one forward pass "
        "per candidate, no sampling; prompts.ref_score) and let the predictor learn how that within-cell rank "
        "moves a root's success, per family and per seen / unseen prompt. Needs run.max_staleness = 0 (the "
        "flow's policy is the rollouts' checkpoint).",
    )
    l2: float = Field(1.0, ge=0.0, le=1e6, description="L2 penalty on a pooled term's intercept and slope.")
    group_l2: float = Field(
        20.0, ge=0.0, le=1e6,
        description="L2 pull of a family's term toward its kind's pooled term (all families, seen or unseen): "
        "with few scored roots of its own a family borrows the pooled slope.",
    )
    min_nodes: int = Field(
        30, ge=2, le=1_000_000,
        description="Scored, labelled roots a pooled term (or a family's, where its kind has no pool) needs.",
    )


class HistoryShiftConfig(BaseModel):
    """A root's record re-weighted to the current policy (``predictor.history_shift``): the rewards
    of a prompt's earlier raw trajectories, importance-weighted by ``π_now / π_then``, move its
    prediction by a learnt slope (``stages.history_shift``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        False,
        description="At stage 2, score each candidate's last raw trajectories under the checkpoint the rollouts use "
        "(one forward pass each, no sampling) against their stored behaviour log-probs; where the record holds "
        "both outcomes, the self-normalised importance-weighted success rate minus the plain one (in logits, "
        "prompts.is_shift) moves the prediction by a slope fitted on the run's earlier outcomes. Needs "
        "run.max_staleness = 0 (the flow's policy is the rollouts' checkpoint).",
    )
    alpha: float = Field(
        0.5, gt=0.0, le=1.0,
        description="Tempering of the sequence weights, w**alpha (1: plain importance weights; smaller: less "
        "variance, more bias toward the plain record).")
    max_trajectories: int = Field(
        8, ge=2, le=256, description="A prompt's most recent raw trajectories scored (bounds the forward passes).")
    l2: float = Field(10.0, ge=0.0, le=1e6, description="L2 pull of the slope toward 0 (no shift).")
    min_rows: int = Field(
        30, ge=2, le=1_000_000,
        description="Sampled roots with a shift and an outcome the slope needs before it moves predictions.")
    max_shift: float = Field(3.0, gt=0.0, le=20.0, description="Bound of the shift's feature, in logits.")


class CalibrationConfig(BaseModel):
    """Two stages, each per node kind (root / prefix) and only where there is enough data."""

    model_config = ConfigDict(extra="forbid")

    prior_method: Literal["platt", "isotonic", "none"] = Field(
        "platt",
        description="Map of the prior, fitted on its own track record: the prior of a past node, taken as of "
        "that node's iteration, is a prospective prediction, so every labelled node (with a cell record "
        "before it) is calibration data without a held-out split.",
    )
    min_prior_nodes: int = Field(
        40, ge=2, le=1_000_000, description="Fewer such nodes of a kind than this: the prior of that kind is used as is."
    )
    method: Literal["platt", "isotonic", "none"] = Field(
        "platt",
        description="Map of the final (prior + head) prediction, fitted on the predictor's own track record: "
        "at each refresh the previous fit first predicts the iteration it has not seen (a prospective "
        "prediction of the deployed model), and those predictions with their outcomes are kept.",
    )
    min_nodes: int = Field(
        50, ge=2, le=1_000_000,
        description="Fewer recorded predictions of a kind than this: the final map of that kind is skipped.",
    )
    track_iterations: int = Field(
        6, ge=1, le=10_000, description="Iterations of recorded predictions kept for the final map (newest)."
    )
    track_discount: float = Field(
        0.8, gt=0.0, le=1.0, description="Weight of a recorded prediction per iteration of age."
    )
    min_isotonic_nodes: int = Field(
        1000, ge=2, le=1_000_000, description="Isotonic needs this many nodes; below it Platt is used instead."
    )


class FlipConfig(BaseModel):
    """The probability that a continuation's reward differs from the raw trajectory's ``r``."""

    model_config = ConfigDict(extra="forbid")

    strength: float = Field(
        5.0, ge=0.0, le=1e6,
        description="Pseudo-count of the success-based flip prior per (r, depth) bin against the observed flips.",
    )
    min_continuations: int = Field(
        150, ge=10, le=1_000_000,
        description="Continuation outcomes needed before the logistic flip model is fitted (below: bins only).",
    )
    discount: float = Field(0.8, gt=0.0, le=1.0, description="Weight of a continuation per iteration of age.")
    c: float = Field(1.0, gt=0.0, le=1e6, description="Inverse L2 strength of the logistic flip model.")


class PredictorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("hashed_mlp", description="Registered predictor to build (see known_predictors()).")
    first_iteration_prior: float = Field(
        0.5, ge=0.0, le=1.0,
        description="Prediction before anything is known (no labelled node, no cell prior).",
    )
    features: FeatureConfig = Field(default_factory=FeatureConfig, description="Node featurisation.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Torch head and training.")
    prior: PriorConfig = Field(default_factory=PriorConfig, description="Hierarchical Beta-Binomial prior.")
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig, description="Calibration maps.")
    flip: FlipConfig = Field(default_factory=FlipConfig, description="Continuation flip model.")
    reference: ReferenceConfig = Field(
        default_factory=ReferenceConfig, description="The roots' reference term (demonstration log-probability).")
    history_shift: HistoryShiftConfig = Field(
        default_factory=HistoryShiftConfig,
        description="The roots' record re-weighted to the current policy (importance weights of earlier trajectories).")
    oracle_samples: int = Field(
        0, ge=0, le=64,
        description="Diagnostic oracle bound: the planner gets success rates sampled under the current policy "
        "(this many episodes per candidate prompt and per open prefix) instead of predictions. The episodes are "
        "neither trained on nor counted in the budget; their tokens are reported apart (oracle_tokens of the "
        "root and prefix stages). 0 = off: the predictor decides.")
    oracle_stages: Literal["both", "roots"] = Field(
        "both", description="Where the oracle bound replaces predictions: both stages, or the roots only (the prompt "
        "choice; prefixes stay predicted, and the bound costs oracle_samples episodes per candidate prompt only).")
    oracle_knows: Literal["rates", "zeros", "extremes"] = Field(
        "rates", description="What the oracle bound tells the root stage, to take its gain apart: its sampled rates "
        "(rates); or the predictions, except that a candidate whose oracle episodes all failed is set to 0 (zeros: "
        "it knows only which prompts are out of reach now), or all failed or all succeeded to 0 or 1 (extremes: "
        "which prompts would teach nothing now). Prefixes, with oracle_stages both, always get the rates.")
    zero_variance_rest: int = Field(
        0, ge=0, le=1000,
        description="Steps a prompt rests after a raw group whose episodes all failed or all succeeded: while its last "
        "raw group within this many steps was one, the root plan is told 0 or 1 for it (what the oracle's extremes "
        "know, read from the prompt's own last visit instead of fresh episodes; GRESO's skip, made deterministic). "
        "0 = off.")
    cooldown: int = Field(
        0, ge=0, le=1000,
        description="Steps a prompt sits out after each visit: while it has a raw group within this many steps, the "
        "root plan is told 0 for it, whatever the outcome, so the plan rotates through the set instead of training "
        "on the same prompts step after step. 0 = off.")
    encoder_path: str | None = Field(
        None, description="hf_encoder only: local path of a Hugging Face encoder (never downloaded)."
    )
    encoder_device: str = Field("cuda", description="hf_encoder only: torch device of the encoder.")
    encoder_max_tokens: int = Field(256, ge=8, le=4096, description="hf_encoder only: tokens per node text.")
