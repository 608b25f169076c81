"""The agent loop in this process: the ``Rollouts`` of a run without rollout workers, and what
each Ray rollout worker holds (``engines.pool``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from trace_core.config import TrainConfig
from trace_core.engines.config import SamplingConfig
from trace_core.envs.base import Env, Task
from trace_core.policy.live import LivePolicy, Policy
from trace_core.rollout.agent_loop import RolloutConfig, evaluate_rewards, extend_prefixes, run_rollouts


class LocalRollouts:
    """The agent loop in this process, on its live policy with ``engine`` (hf / vllm) and torch
    on ``threads`` threads (0 = torch's default)."""

    def __init__(self, live: LivePolicy, envs: Mapping[str, Env], *, engine: str, threads: int) -> None:
        self.live, self.envs, self.engine, self.threads = live, envs, engine, threads

    @classmethod
    def for_config(cls, train: TrainConfig, envs: Mapping[str, Env], *, engine: str, threads: int) -> LocalRollouts:
        """With a live policy of its own (a rollout worker's process)."""
        return cls(LivePolicy(train), envs, engine=engine, threads=threads)

    def _policy(self, checkpoint: str) -> Policy:
        # reloads weights only when the checkpoint changed
        return self.live.get(checkpoint, engine=self.engine, threads=self.threads)

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
