"""The prompt pools of a run: the fixed training set, each iteration's candidates, the held-out set.

They come from the dataset files of the ``data`` section when it names training files
(``trace_core.envs.datasets``: weighted mixing, held-out split), else from the synthetic generators.
Each pool depends only on the config and the iteration, so every strategy of a comparison sees
the same prompts in the same order, and each is computed once per process (a stage asks for
the tasks it needs by prompt id instead of re-deriving the pool).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from trace_core.config import TrainConfig
from trace_core.envs.base import Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.datasets import heldout_pick, loaded, weighted_pick
from trace_core.envs.synthetic import sample_tasks
from trace_core.policy.evaluate import heldout_tasks
from trace_core.stages.run import iteration_seed


@lru_cache(maxsize=4)
def _training_set(env_json: str, n: int, seed: int) -> tuple[Task, ...]:
    return tuple(sample_tasks(EnvConfig.model_validate_json(env_json), n, seed=seed))


def training_set(cfg: TrainConfig) -> tuple[Task, ...]:
    """The fixed training prompts (``run.train_prompts`` of them, or every usable row of the
    data files) candidates are drawn from."""
    if cfg.data.enabled:
        return loaded(cfg.data).train_tasks
    return _training_set(cfg.env.model_dump_json(), cfg.run.train_prompts, iteration_seed(cfg, 0, "train-set"))


@lru_cache(maxsize=8)
def _candidates(cfg_json: str, iteration: int) -> tuple[Task, ...]:
    cfg = TrainConfig.model_validate_json(cfg_json)
    seed = iteration_seed(cfg, iteration, "pool")
    if cfg.data.enabled:
        data = loaded(cfg.data)
        return weighted_pick(data, min(cfg.run.candidate_pool, len(data.train_tasks)), np.random.default_rng(seed))
    if cfg.run.train_prompts == 0:
        return tuple(sample_tasks(cfg.env, cfg.run.candidate_pool, seed=seed))
    train = training_set(cfg)
    k = min(cfg.run.candidate_pool, len(train))
    pick = np.random.default_rng(seed).choice(len(train), size=k, replace=False)
    return tuple(train[i] for i in pick)


def _pool_key(cfg: TrainConfig) -> str:
    """The config fields a pool depends on (the rest of the config does not change it)."""
    run = cfg.run.model_dump(include={"seed", "train_prompts", "candidate_pool", "eval_tasks"})
    return TrainConfig.model_validate({"run": run, "env": cfg.env.model_dump(),
                                       "data": cfg.data.model_dump()}).model_dump_json()


def candidate_pool(cfg: TrainConfig, iteration: int) -> tuple[Task, ...]:
    """Iteration ``i``'s candidate prompts: a function of (run seed, i) only. With
    ``run.train_prompts`` they are a random subset of the fixed training set (prompts recur
    across iterations); with 0 a fresh synthetic pool each iteration; with data files a sample
    mixed by the files' weights."""
    return _candidates(_pool_key(cfg), iteration)


@lru_cache(maxsize=8)
def _by_id(cfg_json: str, iteration: int) -> dict[str, Task]:
    return {t.prompt_id: t for t in _candidates(cfg_json, iteration)}


def tasks_by_id(cfg: TrainConfig, iteration: int) -> dict[str, Task]:
    """The candidate pool of ``iteration`` keyed by prompt id (built once per process)."""
    return _by_id(_pool_key(cfg), iteration)


def heldout_pool(cfg: TrainConfig) -> list[Task]:
    """Held-out prompts for accuracy: fixed per config, disjoint from the training stream,
    about ``run.eval_tasks`` of them spread evenly over the (family, difficulty) cells (with data
    files: drawn from their held-out split)."""
    if cfg.data.enabled:
        return heldout_pick(loaded(cfg.data), cfg.run.eval_tasks, cfg.run.seed)

    fams = [f for f, w in cfg.env.families.items() if w > 0]
    cells = len(fams) * len(cfg.env.difficulties)
    per_cell = max(1, round(cfg.run.eval_tasks / max(cells, 1)))
    return heldout_tasks(fams, cfg.env.difficulties, per_cell, seed=cfg.run.seed)


def probe_pool(cfg: TrainConfig) -> list[Task]:
    """``run.probe_tasks`` training prompts re-scored at each evaluation: the first ones of the fixed
    training set, or (fresh pools, ``run.train_prompts: 0``) of iteration 0's candidates, which a
    run trains on early."""
    n = cfg.run.probe_tasks
    if n == 0:
        return []
    source = training_set(cfg) if cfg.data.enabled or cfg.run.train_prompts else candidate_pool(cfg, 0)
    return list(source[:n])
