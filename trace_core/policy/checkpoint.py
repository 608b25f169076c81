"""Training checkpoints that resume exactly.

A checkpoint directory holds::

    model.safetensors (+ config.json)   save_pretrained of the policy (what engines reload)
    tokenizer files                     when a tokenizer is given (so the dir loads standalone)
    trainer_state.pt                    optimizer, scheduler, RNG states (python, numpy, torch,
                                        cuda), the caller's np.random.Generator, the data cursor

``save_checkpoint`` writes to a temporary sibling and renames it, so a checkpoint is either
wholly there or absent. After ``load_checkpoint`` the same update sequence gives bit-identical
weights on CPU (tested).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"


def _rng_state(rng: np.random.Generator | None) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generator": rng.bit_generator.state if rng is not None else None,
    }


def _set_rng_state(state: dict[str, Any], rng: np.random.Generator | None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if rng is not None and state.get("generator") is not None:
        rng.bit_generator.state = state["generator"]


def save_checkpoint(path: str | Path, model: Any, *, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, cursor: dict[str, Any] | None = None,
                    rng: np.random.Generator | None = None, tokenizer: Any = None) -> Path:
    """Write a checkpoint directory atomically; returns its path.

    ``cursor``: JSON-able position in the data / run (e.g. ``{"iteration": 3, "offset": 192}``).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    torch.save({
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": _rng_state(rng),
        "cursor": json.loads(json.dumps(cursor or {})),  # fail early on non-JSON cursors
    }, tmp / STATE_FILE)
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def load_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint / HF model directory (single or sharded safetensors)."""
    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(path / shard)))
        return state
    single = path / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"no model.safetensors (or index) in {path}")
    return load_file(str(single))


def load_checkpoint(path: str | Path, model: Any, *, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, rng: np.random.Generator | None = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Restore weights (in place), optimizer, scheduler and RNG states; returns the cursor."""
    path = Path(path)
    state = load_model_state(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:  # lm_head may be tied (saved once)
        raise ValueError(f"{path} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    trainer = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    if optimizer is not None and trainer["optimizer"] is not None:
        optimizer.load_state_dict(trainer["optimizer"])
    if scheduler is not None and trainer["scheduler"] is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    if restore_rng:
        _set_rng_state(trainer["rng"], rng)
    return trainer["cursor"]
