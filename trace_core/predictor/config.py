"""Pydantic configuration of the success predictors: one model per concern.

``PredictorConfig`` nests ``FeatureConfig`` (what a node becomes), ``ModelConfig`` (the torch
head and its bounded training), ``CalibrationConfig`` and ``HistoryConfig`` (the per-prompt Beta
posterior). YAML under ``predictor:`` maps 1:1 onto it.
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
    epochs: int = Field(5, ge=1, le=200, description="Passes over the (capped) training set per fit.")
    warm_epochs: int = Field(
        2, ge=1, le=200, description="Passes when warm-starting from the previous fit (incremental refresh)."
    )
    batch_size: int = Field(1024, ge=16, le=65536, description="Minibatch size (nodes).")
    lr: float = Field(0.01, gt=0.0, le=1.0, description="Adam learning rate.")
    weight_decay: float = Field(
        1e-5,
        ge=0.0,
        le=1.0,
        description="Decoupled weight decay of the dense layers (the sparse text table has none).",
    )
    max_train_nodes: int = Field(
        20_000,
        ge=100,
        le=10_000_000,
        description="Cap on labelled nodes per fit; the most recent iterations are kept first (bounded time).",
    )
    max_label_weight: float = Field(
        8.0,
        ge=1.0,
        le=1e6,
        description="A node's subtree_count weight is clipped to this (one tree, one vote).",
    )
    recency_discount: float = Field(
        0.8, gt=0.0, le=1.0, description="Training weight factor per iteration of age (the policy moves)."
    )
    min_fit_nodes: int = Field(
        20, ge=2, le=100_000, description="Below this many labelled nodes the model falls back to the prior."
    )
    seed: int = Field(0, ge=0, description="Seed of the split, the initialisation and minibatch order.")


class CalibrationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Literal["platt", "isotonic", "none"] = Field(
        "platt", description="Calibration map fitted on the held-out split, per node kind (root / prefix)."
    )
    holdout_fraction: float = Field(
        0.2, ge=0.0, le=0.5, description="Share of prompts (grouped by prompt_id) held out for calibration."
    )
    drift: bool = Field(
        True,
        description="Platt only: also fit a per-iteration logit drift on the held-out nodes and extrapolate "
        "it one iteration ahead (the policy improves between fit and use).",
    )
    min_holdout_nodes: int = Field(
        30,
        ge=2,
        le=100_000,
        description="Fewer held-out nodes of a kind than this: that kind stays uncalibrated.",
    )


class HistoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True, description="Combine the model with each prompt's own record (Beta posterior)."
    )
    prior_strength: float = Field(
        4.0,
        ge=0.0,
        le=1e6,
        description="Pseudo-count of the model prior; with 4 a prompt seen 16 times gets 16/20 of its weight "
        "from its own record.",
    )
    discount: float = Field(
        0.7, gt=0.0, le=1.0, description="Weight factor per iteration of age of an outcome (1 = no discount)."
    )
    shift_prefixes: bool = Field(
        True,
        description="Shift prefix logits by the prompt's root posterior-vs-model logit gap (same prompt, same "
        "surprise).",
    )


class PredictorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("hashed_mlp", description="Registered predictor to build (see known_predictors()).")
    first_iteration_prior: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Prediction for every node before anything is labelled (the documented prior).",
    )
    features: FeatureConfig = Field(default_factory=FeatureConfig, description="Node featurisation.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Torch head and training.")
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig, description="Calibration map.")
    history: HistoryConfig = Field(default_factory=HistoryConfig, description="Per-prompt Beta posterior.")
    encoder_path: str | None = Field(
        None, description="hf_encoder only: local path of a Hugging Face encoder (never downloaded)."
    )
    encoder_device: str = Field("cuda", description="hf_encoder only: torch device of the encoder.")
    encoder_max_tokens: int = Field(256, ge=8, le=4096, description="hf_encoder only: tokens per node text.")
