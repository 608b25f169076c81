"""The oracle bound, a diagnostic: the planner fed success rates sampled under the current policy
instead of predicted ones (``predictor.oracle_samples`` episodes per candidate prompt and per open
prefix).

The sampled episodes are neither trained on nor counted in the iteration's budget: they measure
how much selection could buy with perfect prediction, at equal *counted* tokens. Their tokens are
reported apart (``RootAllocation.oracle_tokens``, ``PrefixAllocation.oracle_tokens``), so the
cost of the bound is visible beside it. Every predictor change can then be scored by the share of
the oracle's gain it recovers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from trace_core.config import TrainConfig
from trace_core.envs.base import Task
from trace_core.nodes import with_anchors
from trace_core.runtime import Runtime, rollout_config
from trace_core.stages.run import RunRef, bounded_seed, iteration_seed


def _sampling(cfg: TrainConfig, iteration: int, stage: str):
    return cfg.sampling.model_copy(update={"seed": bounded_seed(iteration_seed(cfg, iteration, stage))})


def _tokens(nodes: pl.DataFrame) -> int:
    return int(nodes["new_tokens"].sum() or 0) if nodes.height else 0


def oracle_root_values(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, tasks: Sequence[Task],
                       runtime: Runtime) -> tuple[np.ndarray, int]:
    """(sampled success rate per task, the tokens the sampling cost): ``oracle_samples`` episodes
    of each candidate under the policy at ``checkpoint``."""
    n = cfg.predictor.oracle_samples
    nodes = runtime.rollouts.raw(
        checkpoint, tasks=list(tasks), counts=[n] * len(tasks), sampling=_sampling(cfg, iteration, "oracle-roots"),
        cfg=rollout_config(cfg), seed=iteration_seed(cfg, iteration, "oracle-roots"), run_id=ref.run_id,
        iteration=iteration, strategy="oracle")
    leaves = nodes.filter(pl.col("is_leaf"))
    rate = leaves.group_by("prompt_id").agg((pl.col("reward") > 0.5).mean().alias("v"))
    by_id = dict(zip(rate["prompt_id"].to_list(), rate["v"].to_list(), strict=True))
    return np.array([by_id.get(t.prompt_id, 0.0) for t in tasks], dtype=float), _tokens(nodes)


def oracle_blend(predicted: np.ndarray, sampled: np.ndarray, knows: str) -> np.ndarray:
    """What the planner is told under ``predictor.oracle_knows``: the sampled rates (``rates``), or
    the predictions with the candidates whose sampled episodes all failed set to 0 (``zeros``), and
    with those that all succeeded set to 1 as well (``extremes``)."""
    predicted, sampled = np.asarray(predicted, dtype=float), np.asarray(sampled, dtype=float)
    if knows == "rates":
        return sampled
    if knows not in ("zeros", "extremes"):
        raise ValueError(f"predictor.oracle_knows must be rates, zeros or extremes, got {knows!r}")
    out = np.where(sampled <= 0.0, 0.0, predicted)
    return np.where(sampled >= 1.0, 1.0, out) if knows == "extremes" else out


def oracle_prefix_values(cfg: TrainConfig, iteration: int, checkpoint: str, tasks_by_prompt: Mapping[str, Task],
                         nodes: pl.DataFrame, cands: pl.DataFrame,
                         runtime: Runtime) -> tuple[np.ndarray, np.ndarray, int]:
    """(sampled success rate under each open prefix of ``cands``, the sampled probability that a
    continuation's reward differs from the raw trajectory's ``r``, the tokens it cost):
    ``oracle_samples`` continuations from every prefix."""
    n = cfg.predictor.oracle_samples
    if not cands.height:
        return np.zeros(0), np.zeros(0), 0
    new = runtime.rollouts.extend(
        checkpoint, tasks_by_prompt=tasks_by_prompt, nodes=nodes, counts=dict.fromkeys(cands["node_id"].to_list(), n),
        sampling=_sampling(cfg, iteration, "oracle-prefixes"), cfg=rollout_config(cfg),
        seed=iteration_seed(cfg, iteration, "oracle-prefixes"))
    tree = with_anchors(pl.concat([nodes, new], how="vertical_relaxed"))
    leaves = tree.filter(pl.col("is_leaf") & (pl.col("origin") == "extension"))
    rate = leaves.group_by("anchor_id").agg((pl.col("reward") > 0.5).mean().alias("v"))
    by_id = dict(zip(rate["anchor_id"].to_list(), rate["v"].to_list(), strict=True))
    v = np.array([by_id.get(i, 0.0) for i in cands["node_id"].to_list()], dtype=float)
    r = (cands["r"].to_numpy() > 0.5).astype(float)
    flip = np.where(r > 0.5, 1.0 - v, v)
    return v, flip, _tokens(new)
