"""The live policy of a process: model, tokenizer, chat format and engine for one checkpoint.

Stages exchange only checkpoint paths; the heavy objects are built from a path on first use in
a process and cached here, so a resumed run or a Prefect worker rebuilds exactly the same state.
A new checkpoint of the same run reloads weights into the cached engine instead of rebuilding
it, as a vLLM worker must. With ``run.rollout_workers >= 1`` generation runs on a Ray pool of
rollout workers (``engines.pool``), started on first use and kept for the run; ``rollouts``
sends a stage there or runs it here. ``fresh=True`` also reloads the trainer model's weights from the
checkpoint when the cached model may have drifted from it (a failed update attempt stepped it).
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any

from trace_core.config import TrainConfig


@dataclass
class Policy:
    """A loaded policy: model, tokenizer, chat format and engine, for one checkpoint."""

    checkpoint: str
    model: Any
    tokenizer: Any
    chat: Any
    engine: Any


_CACHE: dict[str, Policy] = {}
_LOCK = threading.Lock()


def torch_device(cfg: TrainConfig) -> str:
    import torch

    if cfg.run.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.run.device


def load_policy_for(cfg: TrainConfig, checkpoint: str, *, fresh: bool = False) -> Policy:
    """The policy at ``checkpoint`` (cached per process).

    ``fresh``: the model's weights are read from ``checkpoint`` even when cached, so that a retried
    update starts from the checkpoint and not from what a failed attempt left in memory (in a
    normal run they are equal, and so is the result).
    """
    import torch

    from trace_core.engines.base import engine_class
    from trace_core.policy.chat import ChatFormat
    from trace_core.policy.checkpoint import restore_weights
    from trace_core.policy.model import load_policy

    with _LOCK:
        if checkpoint in _CACHE:
            pol = _CACHE[checkpoint]
            if fresh:
                restore_weights(checkpoint, pol.model)
            return pol
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if _CACHE:  # same run, new weights: reload into the live engine
            old = next(iter(_CACHE.values()))
            _CACHE.clear()
            old.engine.load_weights(checkpoint)
            if fresh and getattr(old.engine, "model", None) is not old.model:  # hf: the same model
                restore_weights(checkpoint, old.model)
            pol = Policy(checkpoint, old.model, old.tokenizer, old.chat, old.engine)
        else:
            model, tokenizer = load_policy(checkpoint)
            model.to(torch_device(cfg))
            chat = ChatFormat(tokenizer, template=cfg.model.chat_template,
                              enable_thinking=cfg.model.enable_thinking)
            # with rollout workers the flow's process only updates: a colocated hf engine costs nothing
            name = "hf" if cfg.run.rollout_workers else cfg.run.engine
            engine = engine_class(name).for_policy(model=model, checkpoint=checkpoint, chat=chat,
                                                   seed=cfg.run.seed, config=cfg)
            pol = Policy(checkpoint, model, tokenizer, chat, engine)
        _CACHE[checkpoint] = pol
        return pol


def forget_policies() -> None:
    """Drop the cached policies: the next stage builds its policy from the checkpoint afresh."""
    with _LOCK:
        _CACHE.clear()


_POOL: dict[str, Any] = {}


def rollout_pool(cfg: TrainConfig) -> Any:
    """The process's rollout pool for ``cfg`` (None with ``run.rollout_workers == 0``); a config
    that changes what the workers hold (engine, model, environments, Ray settings) gets a new one."""
    if cfg.run.rollout_workers == 0:
        return None
    from trace_core.engines.pool import RolloutPool

    key = cfg.model_dump_json(include={"run": {"engine", "device", "seed", "rollout_workers"}, "model": True,
                                       "env": True, "data": True, "ray": True, "vllm": True})
    with _LOCK:
        if key not in _POOL:
            close_rollout_pool()
            _POOL[key] = RolloutPool(cfg)
        return _POOL[key]


def close_rollout_pool() -> None:
    """Stop the rollout workers (and the local Ray the pool started, if any)."""
    for pool in _POOL.values():
        pool.close()
    _POOL.clear()


def rollouts(train: TrainConfig, checkpoint: str, kind: str, envs: Any, /, **kwargs: Any) -> Any:
    """A rollout stage (``raw``: ``rollout.run_rollouts``, ``extend``: ``extend_prefixes``, ``eval``:
    ``evaluate_rewards``, same keyword arguments) on the rollout pool, or in this process."""
    pool = rollout_pool(train)
    if pool is not None:
        return {"raw": pool.raw, "extend": pool.extend, "eval": pool.evaluate}[kind](checkpoint, **kwargs)
    return rollouts_here(train, checkpoint, kind, envs, **kwargs)


def rollouts_here(train: TrainConfig, checkpoint: str, kind: str, envs: Any, /, **kwargs: Any) -> Any:
    """A rollout stage on this process's policy at ``checkpoint`` (the flow's, or a rollout worker's)."""
    from trace_core import rollout

    pol = load_policy_for(train, checkpoint)  # reloads weights only when the checkpoint changed
    fn = {"raw": rollout.run_rollouts, "extend": rollout.extend_prefixes, "eval": rollout.evaluate_rewards}[kind]
    return fn(pol.engine, pol.chat, envs, **kwargs)


atexit.register(close_rollout_pool)  # a local Ray started for the run never outlives it
