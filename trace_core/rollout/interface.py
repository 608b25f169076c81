"""One rollouts interface for the stages that generate: raw rollouts, extensions, evaluation.

The run's runtime (``trace_core.runtime``) chooses the implementation once, from the config::

    ro = runtime.rollouts           # LocalRollouts (run.rollout_workers == 0) or the Ray RolloutPool
    nodes = ro.raw(checkpoint, tasks, counts, sampling=..., cfg=..., seed=..., run_id=..., iteration=...)
    new = ro.extend(checkpoint, tasks_by_prompt, nodes, counts, sampling=..., cfg=..., seed=...)
    rewards = ro.evaluate(checkpoint, tasks, samples, sampling=..., cfg=..., seed=...)

* ``LocalRollouts`` (``rollout.local``): the agent loop (``trace_core.rollout.agent_loop``) on a
  live policy at ``checkpoint`` (``policy.live``), with the engine and torch threads it is given.
* ``RolloutPool`` (``engines.pool``): the same calls sharded over ``run.rollout_workers`` Ray
  actors, each holding a ``LocalRollouts`` with engine ``run.engine`` and ``ray.worker_threads``
  threads; the node table is the same as the local one. The flow's process then only trains
  (its policy holds ``run.flow_engine``, see ``RunConfig``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import polars as pl

from trace_core.engines.config import SamplingConfig
from trace_core.envs.base import Task
from trace_core.rollout.agent_loop import RolloutConfig


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
