"""Headroom: how much effective ratio a run's root allocation lost to prediction, and how much
the allocation rule itself leaves, measured against sampled ("oracle") success probabilities.

For each chosen iteration of a finished run, every candidate prompt is sampled ``samples``
times under the checkpoint that iteration started from (the same agent loop as the rollouts),
giving an estimate ``v_true``. Each strategy's root rule is then replayed on the full budget
twice — with the predictor's ``v_pred`` (what the run saw) and with ``v_true`` (a perfect
predictor) — and scored by the *expected* effective ratio under ``v_true``
(``metrics.expected_effective_ratio``; a group of m is all-effective with probability
V_root(v_true, m)). ``lost to prediction`` = oracle - predicted; the best any root rule can do
is the oracle ``trace/trajectories`` allocation (the root objective the run uses by default).

Only the root stage is replayed: continuations need the trees, which the run's store has.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.allocation import get_strategy
from trace_core.config import TrainConfig
from trace_core.home.layout import shard_path
from trace_core.home.shards import read_shard
from trace_core.metrics import expected_effective_ratio
from trace_core.runtime import Runtime, rollout_config
from trace_core.stages.prompt_pools import tasks_by_id
from trace_core.stages.run import RunRef, bounded_seed, initial_checkpoint, iteration_seed

ROOT_RULES = ("grpo", "pcl", "trace/groups", "trace/trajectories")


def sampled_success(runtime: Runtime, cfg: TrainConfig, checkpoint: str, tasks, samples: int,
                    seed: int) -> np.ndarray:
    """``(len(tasks),)`` mean reward of ``samples`` episodes per task (the true v, estimated)."""
    sampling = cfg.sampling.model_copy(update={"seed": bounded_seed(seed)})
    rewards = runtime.rollouts.evaluate(checkpoint, list(tasks), samples, sampling=sampling,
                                        cfg=rollout_config(cfg), seed=seed)
    return (np.asarray(rewards, dtype=float) > 0.5).mean(axis=1)


def replay_roots(v_true: np.ndarray, v_pred: np.ndarray, cfg: TrainConfig, seed: int) -> list[dict]:
    """Each root rule on the full budget, with predicted and with oracle v, scored under v_true."""
    rows = []
    alloc = cfg.allocation
    for name in ROOT_RULES:
        strategy, _, objective = name.partition("/")
        acfg = alloc.with_knobs(strategy, root_objective=objective) if objective else alloc
        strat = get_strategy(strategy)
        out = {"rule": name}
        for label, v in (("predicted", v_pred), ("oracle", v_true)):
            vv = np.clip(v, cfg.allocation.min_prob, 1 - cfg.allocation.min_prob)
            m = np.asarray(strat.allocate_roots(vv, acfg, np.random.default_rng(seed), budget=alloc.budget_total),
                           dtype=np.int64)  # the full budget on roots
            out[label] = expected_effective_ratio(v_true, m)
            out[f"{label}_prompts"] = int((m > 0).sum())
        out["lost_to_prediction"] = out["oracle"] - out["predicted"]
        rows.append(out)
    return rows


def headroom(cfg: TrainConfig, ref: RunRef, iterations: list[int], samples: int = 16) -> pl.DataFrame:
    """The replay table for ``iterations`` of the run ``ref`` (its prompts shards and checkpoints)."""
    with Runtime(cfg) as runtime:
        return pl.DataFrame([row for i in iterations for row in _replay_iteration(runtime, cfg, ref, i, samples)])


def _replay_iteration(runtime: Runtime, cfg: TrainConfig, ref: RunRef, i: int, samples: int) -> list[dict]:
    """The replay rows of iteration ``i``: each root rule, and the run's own allocation."""
    out = []
    path = shard_path(ref.home, "prompts", ref.run_id, "final", i)
    if not path.is_file():
        raise FileNotFoundError(f"run {ref.run_id} has no prompts shard for iteration {i} ({path})")
    prompts = read_shard(path)
    ckpt = initial_checkpoint(cfg) if i == 0 else str(ref.checkpoint(i - 1))
    by_id = tasks_by_id(cfg, i)
    tasks = [by_id[p] for p in prompts["prompt_id"]]
    v_true = sampled_success(runtime, cfg, ckpt, tasks, samples, iteration_seed(cfg, i, "headroom"))
    v_pred = prompts["v_pred"].to_numpy().astype(float)
    for row in replay_roots(v_true, v_pred, cfg, iteration_seed(cfg, i, "roots")):
        out.append({"iteration": i, **row})
    out.append({"iteration": i, "rule": "(run as allocated)",
                "predicted": expected_effective_ratio(v_true, prompts["m_alloc"].to_numpy()),
                "predicted_prompts": int((prompts["m_alloc"] > 0).sum())})
    return out
