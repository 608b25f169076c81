"""One rollouts interface for the stages that generate: raw rollouts, extensions, evaluation.

``rollouts_for(cfg)`` chooses the implementation once, from the config::

    ro = rollouts_for(cfg)          # LocalRollouts (run.rollout_workers == 0) or the Ray RolloutPool
    nodes = ro.raw(checkpoint, tasks, counts, sampling=..., cfg=..., seed=..., run_id=..., iteration=...)
    new = ro.extend(checkpoint, tasks_by_prompt, nodes, counts, sampling=..., cfg=..., seed=...)
    rewards = ro.evaluate(checkpoint, tasks, samples, sampling=..., cfg=..., seed=...)

* ``LocalRollouts``: the agent loop (``trace_core.rollout.agent_loop``) on this process's live policy at
  ``checkpoint`` (``policy.live``), with the engine and torch threads it is given.
* ``RolloutPool`` (``engines.pool``): the same calls sharded over ``run.rollout_workers`` Ray
  actors, each holding a ``LocalRollouts`` with engine ``run.engine`` and ``ray.worker_threads``
  threads; the node table is the same as the local one. The flow's process then only trains
  (its policy holds ``run.flow_engine``, see ``RunConfig``).

The pool is started on first use and kept for the run (``close_rollouts`` stops it; at exit too).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import polars as pl

from trace_core.config import TrainConfig
from trace_core.engines.config import SamplingConfig
from trace_core.envs.base import Env, Task
from trace_core.policy.live import load_policy_for
from trace_core.rollout.agent_loop import RolloutConfig, evaluate_rewards, extend_prefixes, run_rollouts


class Rollouts(Protocol):
    """Where a stage's episodes are generated; every method samples from the policy at ``checkpoint``."""

    def raw(self, checkpoint: str, tasks: Sequence[Task], counts: Sequence[int], *, sampling: SamplingConfig,
            cfg: RolloutConfig, seed: int, run_id: str, iteration: int, strategy: str = "uniform",
            v_pred: Sequence[float] | None = None, utility: Sequence[float] | None = None) -> pl.DataFrame:
        """``counts[i]`` raw episodes of ``tasks[i]``: ``rollout.run_rollouts``'s rows, in its order."""

    def extend(self, checkpoint: str, tasks_by_prompt: Mapping[str, Task], nodes: pl.DataFrame,
               counts: Mapping[str, int], *, sampling: SamplingConfig, cfg: RolloutConfig,
               seed: int) -> pl.DataFrame:
        """``counts[node_id]`` continuations of each prefix of ``nodes``: ``rollout.extend_prefixes``'s rows."""

    def evaluate(self, checkpoint: str, tasks: Sequence[Task], samples: int, *, sampling: SamplingConfig,
                 cfg: RolloutConfig, seed: int) -> np.ndarray:
        """Rewards ``(len(tasks), samples)``: ``rollout.evaluate_rewards``."""


class LocalRollouts:
    """The agent loop in this process, on its live policy with ``engine`` (hf / vllm) and torch
    on ``threads`` threads (0 = torch's default)."""

    def __init__(self, train: TrainConfig, envs: Mapping[str, Env], *, engine: str, threads: int) -> None:
        self.train, self.envs, self.engine, self.threads = train, envs, engine, threads

    def _policy(self, checkpoint: str) -> Any:
        # reloads weights only when the checkpoint changed
        return load_policy_for(self.train, checkpoint, engine=self.engine, threads=self.threads)

    def raw(self, checkpoint: str, tasks: Sequence[Task], counts: Sequence[int], *, sampling: SamplingConfig,
            cfg: RolloutConfig, seed: int, run_id: str, iteration: int, strategy: str = "uniform",
            v_pred: Sequence[float] | None = None, utility: Sequence[float] | None = None) -> pl.DataFrame:
        pol = self._policy(checkpoint)
        return run_rollouts(pol.engine, pol.chat, self.envs, tasks, counts, sampling=sampling, cfg=cfg, seed=seed,
                            run_id=run_id, iteration=iteration, strategy=strategy, v_pred=v_pred, utility=utility)

    def extend(self, checkpoint: str, tasks_by_prompt: Mapping[str, Task], nodes: pl.DataFrame,
               counts: Mapping[str, int], *, sampling: SamplingConfig, cfg: RolloutConfig,
               seed: int) -> pl.DataFrame:
        pol = self._policy(checkpoint)
        return extend_prefixes(pol.engine, pol.chat, self.envs, tasks_by_prompt, nodes, counts, sampling=sampling,
                               cfg=cfg, seed=seed)

    def evaluate(self, checkpoint: str, tasks: Sequence[Task], samples: int, *, sampling: SamplingConfig,
                 cfg: RolloutConfig, seed: int) -> np.ndarray:
        pol = self._policy(checkpoint)
        return evaluate_rewards(pol.engine, pol.chat, self.envs, tasks, samples, sampling=sampling, cfg=cfg, seed=seed)


_POOL: dict[str, Any] = {}
_LOCK = threading.Lock()


def rollouts_for(cfg: TrainConfig) -> Rollouts:
    """The run's rollouts: a Ray pool of ``run.rollout_workers`` (>= 1) workers, kept while the
    config keeps what the workers hold (engine, model, environments, Ray settings), else local."""
    from trace_core.stages.iteration import environments

    if cfg.run.rollout_workers == 0:
        return LocalRollouts(cfg, environments(cfg), engine=cfg.run.engine, threads=cfg.run.threads)
    from trace_core.engines.pool import RolloutPool

    key = cfg.model_dump_json(include={"run": {"engine", "device", "seed", "rollout_workers"}, "model": True,
                                       "env": True, "data": True, "ray": True, "vllm": True})
    with _LOCK:
        if key not in _POOL:
            close_rollouts()
            _POOL[key] = RolloutPool(cfg)
        return _POOL[key]


def close_rollouts() -> None:
    """Stop the rollout workers (and the local Ray the pool started, if any)."""
    for pool in _POOL.values():
        pool.close()
    _POOL.clear()


atexit.register(close_rollouts)  # a local Ray started for the run never outlives it
