"""Rest after zero variance (``predictor.zero_variance_rest``): a prompt whose last raw group, within
a window of steps, failed or succeeded every episode is planned at 0 or 1, so the root plan leaves
it out until the window passes.

What the oracle bound's ``extremes`` know (``stages.oracle``), read from the prompt's own last visit
instead of fresh episodes: GRESO's skip of zero-variance prompts, made deterministic.

Cool-down (``predictor.cooldown``): a prompt sampled within the window, whatever its outcome, is
planned at 0, so the plan rotates through the set instead of training on the same prompts step
after step (told the extremes, the oracle picks the previous step's prompts half as often).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.stages.history import history_nodes
from trace_core.stages.oracle import oracle_blend
from trace_core.stages.run import RunRef
from trace_core.stages.versions import rollout_version


def last_raw_rates(ref: RunRef, iteration: int, window: int, max_version: int | None = None) -> dict[str, float]:
    """Each prompt's success rate in its last raw group of the ``window`` iterations before
    ``iteration`` (outcomes of policy versions ``<= max_version`` only, as ``history_nodes``)."""
    leaves = history_nodes(ref, iteration, max_version, since=iteration - window)
    leaves = leaves.filter(pl.col("is_leaf") & (pl.col("origin") == "raw"))
    if not leaves.height:
        return {}
    groups = (leaves.group_by("prompt_id", "iteration").agg((pl.col("reward") > 0.5).mean().alias("rate"))
              .sort("iteration").group_by("prompt_id").agg(pl.col("rate").last()))
    return dict(zip(groups["prompt_id"].to_list(), groups["rate"].to_list(), strict=True))


def rest_zero_variance(v: np.ndarray, prompt_ids: list[str], last: dict[str, float]) -> np.ndarray:
    """``v`` with each prompt whose last raw group (``last_raw_rates``) all failed set to 0 and
    all succeeded set to 1 (``predictor.zero_variance_rest``): the plan leaves it out."""
    rate = np.array([last.get(p, np.nan) for p in prompt_ids], dtype=float)  # NaN: no record, v kept
    return oracle_blend(v, rate, "extremes")


def cool_down(v: np.ndarray, prompt_ids: list[str], last: dict[str, float]) -> np.ndarray:
    """``v`` with every prompt that has a raw group in the window (``last_raw_rates``) set to 0
    (``predictor.cooldown``): the plan leaves it out."""
    visited = np.array([p in last for p in prompt_ids], dtype=bool)
    return np.where(visited, 0.0, np.asarray(v, dtype=np.float64))


def rested(ref: RunRef, cfg, iteration: int, v: np.ndarray, prompt_ids: list[str]) -> np.ndarray:
    """``v`` as the root plan reads it after ``predictor.zero_variance_rest`` and ``predictor.cooldown``
    (unclipped; each reads the outcomes the plan may read, as ``history_nodes``)."""
    p, version = cfg.predictor, rollout_version(iteration, cfg.run.max_staleness)
    if p.zero_variance_rest:
        v = rest_zero_variance(v, prompt_ids, last_raw_rates(ref, iteration, p.zero_variance_rest, max_version=version))
    if p.cooldown:
        v = cool_down(v, prompt_ids, last_raw_rates(ref, iteration, p.cooldown, max_version=version))
    return v
