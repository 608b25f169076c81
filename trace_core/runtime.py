"""The runtime of a run: the heavy objects its stages share in one process.

    environments   one per family (the QA search index is built once)
    live policy    the checkpoint's model, tokenizer, chat format and engine (``policy.live``)
    rollouts       where episodes are generated: this process, or the Ray pool of rollout workers
    evaluation     where held-out episodes are scored: the rollouts, except in a pipelined run
                   without workers (run.max_staleness > 0), where the rollout side samples on a
                   policy of its own while the update trains, and evaluation uses the trainer's

The flow builds one ``Runtime`` and passes it to every stage that generates, verifies or trains;
stages stay functions of their inputs (a record in, a record out), and the runtime is kept out of
Prefect's cache key (``tasks.cache.PortableInputs`` skips it): it changes how fast a stage runs,
never what it computes. ``close()`` (or leaving the ``with`` block) stops the rollout workers::

    with Runtime(cfg) as runtime:
        raw = generate_raw_rollouts(ref, cfg, i, checkpoint, roots, runtime)
"""

from __future__ import annotations

from typing import Any

from trace_core.advantages.estimators import adv_est_names
from trace_core.allocation.strategies import strategy_names
from trace_core.config import TrainConfig
from trace_core.config.io import ConfigError
from trace_core.engines.base import engine_names
from trace_core.engines.pool import RolloutPool
from trace_core.envs.base import Env
from trace_core.envs.datasets import build_environments
from trace_core.envs.loaders import LOADERS
from trace_core.policy.live import LivePolicy, Policy
from trace_core.rollout.agent_loop import RolloutConfig
from trace_core.rollout.interface import Rollouts
from trace_core.rollout.local import LocalRollouts


def check_names(cfg: TrainConfig) -> TrainConfig:
    """The config's names checked against the registries that implement them, once, at start (a
    config is plain data and imports no implementation). ``ConfigError`` names the field."""
    known = {"run.engine": ("engine", cfg.run.engine, engine_names()),
             "allocation.strategy": ("strategy", cfg.allocation.strategy, strategy_names()),
             "advantage.estimator": ("advantage estimator", cfg.advantage.estimator, adv_est_names())}
    for split in ("train", "heldout"):
        for i, entry in enumerate(getattr(cfg.data, split)):
            known[f"data.{split}[{i}].loader"] = ("loader", entry.loader, LOADERS.names())
    for field, (kind, name, names) in known.items():
        if name not in names:
            raise ConfigError(f"{field}: unknown {kind} {name!r}; known: {', '.join(names)}")
    return cfg


def rollout_config(cfg: TrainConfig) -> RolloutConfig:
    """The agent loop's limits for this run: turns, and the context the model can hold."""
    return RolloutConfig(max_turns=cfg.env.max_turns,
                         max_context_tokens=min(cfg.model.max_position_embeddings - cfg.sampling.max_new_tokens,
                                                cfg.env.max_tokens_per_episode + 1024))


class Runtime:
    """Environments, the live policy and the rollouts of one run in this process, built on
    first use. A plain object (no dataclass): Prefect does not walk into it."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = check_names(cfg)
        self.live = LivePolicy(cfg)  # shared by local rollouts and the update: one model in memory
        self._envs: dict[str, Env] | None = None
        self._rollouts: Rollouts | None = None
        self._evaluation: Rollouts | None = None

    @property
    def envs(self) -> dict[str, Env]:
        if self._envs is None:
            self._envs = build_environments(self.cfg.env, self.cfg.data)
        return self._envs

    @property
    def rollouts(self) -> Rollouts:
        """The run's rollouts: a Ray pool of ``run.rollout_workers`` (>= 1) workers, else local."""
        if self._rollouts is None:
            cfg = self.cfg
            # pipelined, the rollout side samples while the update trains: a model of its own
            live = LivePolicy(cfg) if cfg.run.max_staleness else self.live
            self._rollouts = (RolloutPool(cfg) if cfg.run.rollout_workers
                              else LocalRollouts(live, self.envs, engine=cfg.run.engine, threads=cfg.run.threads))
        return self._rollouts

    @property
    def evaluation(self) -> Rollouts:
        """Where held-out episodes are scored: ``rollouts``, but the trainer's own policy in a
        pipelined run without workers (its rollout side's policy is busy at older weights)."""
        if self._evaluation is None:
            cfg = self.cfg
            self._evaluation = (LocalRollouts(self.live, self.envs, engine=cfg.run.engine, threads=cfg.run.threads)
                                if cfg.run.max_staleness and not cfg.run.rollout_workers else self.rollouts)
        return self._evaluation

    def policy(self, checkpoint: str, *, fresh: bool = False) -> Policy:
        """The flow process's policy at ``checkpoint`` (engine ``run.flow_engine``)."""
        return self.live.get(checkpoint, fresh=fresh)

    def close(self) -> None:
        """Stop the rollout workers (and the local Ray the pool started, if any); drop the policy."""
        if isinstance(self._rollouts, RolloutPool):
            self._rollouts.close()
        self._rollouts = self._evaluation = None
        self.live.forget()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:  # what Prefect shows for the parameter
        return f"Runtime(workers={self.cfg.run.rollout_workers}, engine={self.cfg.run.engine})"
