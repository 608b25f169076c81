"""Agent environments: one package per family (``math``, ``qa``, ``fc``), each registering its env,
synthetic generator and demonstration writer (``trace_core.envs.families``); ``Env.reset(task) -> Episode``.

``make_env(family, **cfg)`` builds one env; ``cfg`` are ``EnvConfig`` field names (validated;
``families`` / ``difficulties`` are ignored by a single env) plus family extras (QA: ``corpus``).
``make_envs(cfg)`` builds one per family with positive weight.
"""

from __future__ import annotations

from typing import Any

from trace_core.envs import fc, math, qa  # noqa: F401  (importing a family package registers it)
from trace_core.envs.base import Env, Episode, StepResult, Task, replay
from trace_core.envs.config import EnvConfig
from trace_core.envs.families import ENVS, register_env

_EXTRAS = {"corpus"}


def make_env(family: str, config: EnvConfig | None = None, **cfg: Any) -> Env:
    """``make_env("math", max_turns=6)`` or ``make_env("qa", config=env_cfg, corpus=paras)``."""
    factory = ENVS.get_item(family)
    extras = {k: cfg.pop(k) for k in list(cfg) if k in _EXTRAS}
    base = config.model_dump() if config is not None else {}
    env_cfg = EnvConfig(**{**base, **cfg})
    return factory(env_cfg, **extras)


def make_envs(config: EnvConfig) -> dict[str, Env]:
    """One env per family with a positive mix weight."""
    return {f: make_env(f, config=config) for f, w in config.families.items() if w > 0}


__all__ = ["ENVS", "Env", "EnvConfig", "Episode", "StepResult", "Task", "make_env", "make_envs",
           "register_env", "replay"]
