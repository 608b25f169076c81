"""What the stages of one run share: its paths, its prompt stream and a per-process policy cache.

Stages exchange only small references (paths, checkpoint directories, summary dicts); the heavy
objects (model, tokenizer, engine, envs) are rebuilt from those references on first use in a
process and cached here, so a resumed run or a Prefect worker rebuilds exactly the same state.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from trace_core.config import TrainConfig
from trace_core.envs.base import Task


@dataclass(frozen=True)
class RunRef:
    """Where a run lives: ``home/runs/<run_id>/`` holds its staging files, checkpoints and
    predictor states; ``home/shards/`` the Parquet shards behind the DuckDB views."""

    home: str
    run_id: str

    @property
    def run_dir(self) -> Path:
        return Path(self.home) / "runs" / self.run_id

    def staging(self, iteration: int, name: str) -> Path:
        """Intermediate stage output (not behind the views: the final nodes shard is)."""
        d = self.run_dir / "staging" / f"iter={iteration:05d}"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{name}.parquet"

    def checkpoint(self, iteration: int) -> Path:
        return self.run_dir / "checkpoints" / f"iter={iteration:05d}"

    def predictor(self, iteration: int) -> Path:
        d = self.run_dir / "predictor"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"iter={iteration:05d}.pt"


def iteration_seed(cfg: TrainConfig, iteration: int, stage: str) -> int:
    """A seed for (run seed, iteration, stage): every random choice of a stage derives from it."""
    salt = int.from_bytes(stage.encode()[:8].ljust(8, b"\0"), "little")
    return int(np.random.SeedSequence([cfg.run.seed, iteration, salt]).generate_state(1)[0])


@lru_cache(maxsize=4)
def _training_set(env_json: str, n: int, seed: int) -> tuple[Task, ...]:
    from trace_core.envs.config import EnvConfig
    from trace_core.envs.synthetic import sample_tasks

    return tuple(sample_tasks(EnvConfig.model_validate_json(env_json), n, seed=seed))


def candidate_pool(cfg: TrainConfig, iteration: int) -> list[Task]:
    """The prompt stream: iteration ``i``'s candidates depend only on (run seed, i), so every
    strategy of a comparison sees the same prompts in the same order. With ``run.train_prompts``
    they are a random subset of a fixed training set (prompts recur across iterations)."""
    from trace_core.envs.synthetic import sample_tasks

    seed = iteration_seed(cfg, iteration, "pool")
    if cfg.run.train_prompts == 0:
        return sample_tasks(cfg.env, cfg.run.candidate_pool, seed=seed)
    train = _training_set(cfg.env.model_dump_json(), cfg.run.train_prompts, iteration_seed(cfg, 0, "train-set"))
    k = min(cfg.run.candidate_pool, len(train))
    pick = np.random.default_rng(seed).choice(len(train), size=k, replace=False)
    return [train[i] for i in pick]


def heldout_pool(cfg: TrainConfig) -> list[Task]:
    """Held-out prompts for accuracy: fixed per config, disjoint from the training stream."""
    from trace_core.policy.evaluate import heldout_tasks

    fams = [f for f, w in cfg.env.families.items() if w > 0]
    cells = len(fams) * len(cfg.env.difficulties)
    per_cell = max(1, round(cfg.run.eval_tasks / max(cells, 1)))
    return heldout_tasks(fams, cfg.env.difficulties, per_cell, seed=cfg.run.seed)


def initial_checkpoint(cfg: TrainConfig) -> str:
    from trace_core.policy.model import TINY_WARM_DIR

    path = Path(cfg.model.path) if cfg.model.path else TINY_WARM_DIR
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {path}: set model.path to a local HF model directory, "
                                "or run `trace-rl warmup` to rebuild the tiny checkpoint")
    return str(path)


def torch_device(cfg: TrainConfig) -> str:
    import torch

    if cfg.run.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.run.device


@dataclass
class Policy:
    """A loaded policy: model, tokenizer, chat format, engine and envs, for one checkpoint."""

    checkpoint: str
    model: Any
    tokenizer: Any
    chat: Any
    engine: Any
    envs: dict[str, Any]


_CACHE: dict[str, Policy] = {}
_LOCK = threading.Lock()


def load_policy_for(cfg: TrainConfig, checkpoint: str) -> Policy:
    """The policy at ``checkpoint`` (cached per process; a new checkpoint reloads weights into
    the cached engine instead of rebuilding it, as a vLLM worker must)."""
    import torch

    from trace_core.engines.base import engine_class
    from trace_core.envs import make_envs
    from trace_core.policy.chat import ChatFormat
    from trace_core.policy.model import load_policy

    with _LOCK:
        if checkpoint in _CACHE:
            return _CACHE[checkpoint]
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if _CACHE:  # same run, new weights: reload into the live engine
            old = next(iter(_CACHE.values()))
            _CACHE.clear()
            old.engine.load_weights(checkpoint)
            pol = Policy(checkpoint, old.model, old.tokenizer, old.chat, old.engine, old.envs)
        else:
            model, tokenizer = load_policy(checkpoint)
            model.to(torch_device(cfg))
            chat = ChatFormat(tokenizer)
            engine = engine_class(cfg.run.engine).for_policy(model=model, checkpoint=checkpoint, chat=chat,
                                                             seed=cfg.run.seed)
            pol = Policy(checkpoint, model, tokenizer, chat, engine, make_envs(cfg.env))
        _CACHE[checkpoint] = pol
        return pol
