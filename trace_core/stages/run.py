"""A run's identity: where it lives on disk and the seeds its stages draw from.

Every layer that needs a run's files (the stages, tracking, compare, the report) asks a
``RunRef`` instead of rebuilding ``home/runs/<id>`` itself.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trace_core.config import TrainConfig
from trace_core.policy.model import TINY_WARM_DIR

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # = the shard partition rule (shards._SAFE)
MAX_RUN_ID = 128  # a path component, a shard partition value and an MLflow run name


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is a safe single path component; ``ValueError`` (one line) otherwise.

    Letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit (so never ``.``,
    ``..``, a hidden directory or a flag), at most 128 characters: an id never leaves
    ``home/runs/``, and is refused here rather than late, at the first shard write.
    """
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or len(run_id) > MAX_RUN_ID:
        raise ValueError(f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-', starting with "
                         f"a letter or digit, at most {MAX_RUN_ID} characters")
    return run_id


@dataclass(frozen=True)
class RunRef:
    """Where a run lives: ``home/runs/<run_id>/`` holds its staging files, checkpoints,
    predictor states and artifacts; ``home/shards/`` the Parquet shards behind the DuckDB views."""

    home: str
    run_id: str

    def __post_init__(self) -> None:
        check_run_id(self.run_id)

    @property
    def run_dir(self) -> Path:
        return Path(self.home) / "runs" / self.run_id

    @property
    def artifacts_dir(self) -> Path:
        return self.run_dir / "artifacts"

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
        return d / f"iter={iteration:05d}.safetensors"


def run_dir(home: str | Path, run_id: str) -> Path:
    """``home/runs/<run_id>`` (for callers that hold a home and an id, not a ``RunRef``)."""
    return RunRef(str(home), run_id).run_dir


def new_run_id(strategy: TrainConfig | str) -> str:
    """A fresh run id: ``<strategy>-<UTC-less local time>-<6 hex>`` (a config gives its strategy)."""
    name = strategy if isinstance(strategy, str) else strategy.allocation.strategy
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def iteration_seed(cfg: TrainConfig, iteration: int, stage: str) -> int:
    """A seed for (run seed, iteration, stage): every random choice of a stage derives from it."""
    salt = int.from_bytes(stage.encode()[:8].ljust(8, b"\0"), "little")
    return int(np.random.SeedSequence([cfg.run.seed, iteration, salt]).generate_state(1)[0])


SEED_MODULUS = 2**31  # torch.manual_seed and vLLM's per-request seed take seeds below this


def bounded_seed(seed: int) -> int:
    """``seed`` (e.g. a 64-bit ``iteration_seed``) reduced below ``SEED_MODULUS``: what the stages pass
    to ``torch.manual_seed``, ``SamplingConfig.seed`` and vLLM's ``SamplingParams.seed``."""
    return int(seed) % SEED_MODULUS


TORCH_RNG = threading.Lock()  # the process's global torch RNG (see ``torch_seeded``)


@contextlib.contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """``torch.manual_seed(seed)``, and the block's draws from the global torch RNG, with no other
    thread seeding it in between: the pipeline fits the predictor while the update starts, and a
    seed set by one must not move the other's draws (the same config and seed give the same trees)."""
    with TORCH_RNG:
        torch.manual_seed(seed)
        yield


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``, never in the middle of another thread's ``torch_seeded`` block."""
    with TORCH_RNG:
        torch.manual_seed(seed)


def initial_checkpoint(cfg: TrainConfig) -> str:
    """The checkpoint iteration 0 starts from: ``model.path`` or the shipped tiny policy."""
    path = Path(cfg.model.path) if cfg.model.path else TINY_WARM_DIR
    if not (path / "config.json").is_file():
        what = "no directory" if not path.exists() else "no config.json in it"
        if cfg.model.path:
            raise FileNotFoundError(f"model.path {path}: {what}; set model.path to a local Hugging Face model "
                                    "directory (config.json, weights, tokenizer)")
        raise FileNotFoundError(f"no shipped model at {path} ({what}): rebuild it with "
                                f"`trace-rl warmup --out {path}`, or set model.path")
    return str(path)
