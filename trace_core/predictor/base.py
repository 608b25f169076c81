"""Predictor protocol, fit report, labels and the predictor registry.

A predictor maps rollout-tree nodes (rows of ``trace_core.nodes.NODE_SCHEMA``) to success
probabilities, one model for prompts (roots) and turn prefixes alike:

* ``fit(nodes, *, cell_prior=None) -> FitReport`` with *all labelled nodes so far* (every earlier
  iteration) and optionally the per-(family, difficulty) outcomes measured before training
  (``task, difficulty, n_success, n_total``); it refreshes the model in bounded time and may
  warm-start from the previous fit;
* ``predict(nodes) -> np.ndarray`` of shape ``(len(nodes),)``, float64 in ``[0, 1]``;
* ``predict_flip(prefixes) -> np.ndarray``: for prefixes with the raw trajectory's 0/1 reward in
  column ``r``, the probability that a continuation's reward differs from ``r``;
* ``save(path)`` / ``trace_core.predictor.load_predictor(path)``: JSON + safetensors, never pickle.

Node frame convention (the rollout loop follows it):

* a root row has ``depth == 0`` and ``origin == 'root'``; its ``action_text`` holds the question
  (``Task.question``), ``task`` the family and ``difficulty`` the known difficulty;
* a prefix row (``depth >= 1``) holds its own turn in ``action_text`` / ``observation_text``.
  Its text is the whole path: a ``path_text`` column is used when present (non-null), otherwise
  the path is rebuilt by following ``parent_id`` through the rows of the same frame, so pass the
  ancestors along (they are cheap) or fill ``path_text``. Raw leaves of the same prompt and
  iteration in the frame (finished sibling rollouts) inform a prefix's prediction; its own
  trajectory's leaf never does.

Labels: a node's outcome is ``subtree_mean_reward`` (the mean reward of the trajectories through
it), weighted by ``subtree_count``. A node is labelled when both are non-null and the count > 0.

Registry: ``@register_predictor(name)`` on a factory ``(PredictorConfig) -> Predictor``; a
duplicate name is rejected; ``make_predictor(config)`` raises on an unknown name, listing the
known ones. ``hf_encoder`` is registered by import path so transformers loads only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import polars as pl

from trace_core.predictor.config import PredictorConfig
from trace_core.registry import Registry
from trace_core.stages.results import (
    FitReport,  # the report is a stage record's field (Prefect caches it as JSON)
)


@runtime_checkable
class Predictor(Protocol):
    config: PredictorConfig

    def fit(self, nodes: pl.DataFrame, *, cell_prior: pl.DataFrame | None = None) -> FitReport: ...

    def predict(self, nodes: pl.DataFrame) -> np.ndarray: ...

    def predict_flip(self, prefixes: pl.DataFrame) -> np.ndarray: ...

    def save(self, path: str | Path) -> Path: ...


def is_root(nodes: pl.DataFrame) -> np.ndarray:
    """Boolean ``(n,)``: depth 0 (the prompt itself)."""
    return (nodes["depth"].fill_null(0) == 0).to_numpy()


def labelled(nodes: pl.DataFrame) -> pl.DataFrame:
    """Rows with an outcome: non-null, finite ``subtree_mean_reward`` and ``subtree_count > 0``."""
    if nodes.height == 0:
        return nodes
    return nodes.filter(
        pl.col("subtree_mean_reward").is_not_null()
        & pl.col("subtree_mean_reward").is_finite()
        & (pl.col("subtree_count").fill_null(0) > 0)
    )


def node_labels(nodes: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(y, w)``, both float64 ``(n,)``: y = subtree mean reward clipped to [0, 1], w = subtree count."""
    y = np.clip(nodes["subtree_mean_reward"].cast(pl.Float64).to_numpy(), 0.0, 1.0)
    w = nodes["subtree_count"].cast(pl.Float64).fill_null(0.0).to_numpy()
    return y, w


def is_labelled(nodes: pl.DataFrame) -> np.ndarray:
    """Boolean ``(n,)``: the rows ``labelled`` keeps."""
    if nodes.height == 0:
        return np.zeros(0, dtype=bool)
    return (nodes["subtree_mean_reward"].is_not_null() & nodes["subtree_mean_reward"].is_finite().fill_null(False)
            & (nodes["subtree_count"].fill_null(0) > 0)).to_numpy()  # fmt: skip


def decision_rows(nodes: pl.DataFrame) -> np.ndarray:
    """Boolean ``(n,)``: roots and raw non-leaf prefixes, the nodes scored at decision time."""
    depth = nodes["depth"].fill_null(0).to_numpy()
    raw = (nodes["origin"].fill_null("raw") == "raw").to_numpy()
    leaf = nodes["is_leaf"].fill_null(False).to_numpy()
    return (depth == 0) | (raw & ~leaf)


def decision_labels(nodes: pl.DataFrame, counts: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(y, w)``, both ``(n,)``: a prefix's subtree label (``node_labels``); a root's raw-rollout
    success rate from ``counts`` (``prior.outcome_counts``: ``prompt_id, iteration, s, n``) when
    present - what root allocation predicts. The continuations below a root were chosen by prefix
    allocation; their outcomes are not the prompt's success rate."""
    y, w = node_labels(nodes)
    if nodes.height == 0 or counts.height == 0:
        return y, w
    raw = (nodes.select(pl.int_range(nodes.height).alias("row"), "prompt_id", pl.col("iteration").cast(pl.Int64))
           .join(counts.select("prompt_id", "iteration", "s", "n"), on=["prompt_id", "iteration"], how="left")
           .sort("row"))  # fmt: skip
    roots = is_root(nodes) & raw["n"].is_not_null().to_numpy()
    n = raw["n"].fill_null(1.0).to_numpy()
    return np.where(roots, raw["s"].fill_null(0.0).to_numpy() / n, y), np.where(roots, n, w)


PredictorFactory = Callable[[PredictorConfig], Predictor]
# ``hf_encoder`` is imported on first use (keeps transformers out of CPU runs)
_REGISTRY: Registry[PredictorFactory] = Registry(
    "predictor", lazy={"hf_encoder": "trace_core.predictor.hf_encoder:HFEncoderPredictor"})


def register_predictor(name: str) -> Callable[[PredictorFactory], PredictorFactory]:
    return _REGISTRY.register(name)


def known_predictors() -> list[str]:
    return _REGISTRY.names()


def make_predictor(config: PredictorConfig | None = None, **overrides) -> Predictor:
    """Build the predictor named by ``config.name`` (default config: ``hashed_mlp``)."""
    cfg = config or PredictorConfig()
    if overrides:
        cfg = cfg.model_copy(update=overrides)
    try:
        factory = _REGISTRY.get_item(cfg.name)
    except KeyError as err:
        raise ValueError(err.args[0]) from None
    return factory(cfg)
