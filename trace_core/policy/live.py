"""The live policy of a process: model, tokenizer, chat format and engine for one checkpoint.

Stages exchange only checkpoint paths; the heavy objects are built from a path on first use and
held by a ``LivePolicy`` that the run's runtime owns (``trace_core.runtime``), so a resumed run
or a Prefect worker rebuilds exactly the same state. A new checkpoint of the same run reloads
weights into the held engine instead of rebuilding it, as a vLLM worker must. Which engine a
process holds is the caller's explicit choice: the flow's process ``run.flow_engine``, a rollout
worker ``run.engine``. ``fresh=True`` also reloads the trainer model's weights from the
checkpoint when the held model may have drifted from it (a failed update attempt stepped it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from trace_core.config import TrainConfig
from trace_core.engines.base import engine_class
from trace_core.policy.chat import ChatFormat
from trace_core.policy.checkpoint import restore_weights
from trace_core.policy.model import load_policy


@dataclass
class Policy:
    """A loaded policy: model, tokenizer, chat format and engine, for one checkpoint."""

    checkpoint: str
    model: Any
    tokenizer: Any
    chat: Any
    engine: Any


def torch_device(cfg: TrainConfig) -> str:
    if cfg.run.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.run.device


class LivePolicy:
    """The policy one process holds: at most one checkpoint's weights in one engine.

    ``get(checkpoint)`` returns it, loading weights only when the checkpoint changed;
    ``forget()`` drops it (the next ``get`` builds it from the checkpoint afresh).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self._held: dict[str, Policy] = {}  # one entry: checkpoint -> its policy
        self._lock = threading.Lock()

    def get(self, checkpoint: str, *, fresh: bool = False, engine: str | None = None,
            threads: int | None = None) -> Policy:
        """The policy at ``checkpoint``, holding engine ``engine`` with torch on ``threads``
        threads (0 = torch's default); None = the flow's process: ``run.flow_engine``,
        ``run.threads``. A held policy with another engine is dropped, not reused.

        ``fresh``: the model's weights are read from ``checkpoint`` even when held, so that a
        retried update starts from the checkpoint and not from what a failed attempt left in
        memory (in a normal run they are equal, and so is the result).
        """
        cfg = self.cfg
        engine = engine or cfg.run.flow_engine
        threads = cfg.run.threads if threads is None else threads
        held = self._held
        with self._lock:
            if held and next(iter(held.values())).engine.name != engine:
                held.clear()
            if checkpoint in held:
                pol = held[checkpoint]
                if fresh:
                    restore_weights(checkpoint, pol.model)
                return pol
            if threads:
                torch.set_num_threads(threads)
            if held:  # same run, new weights: reload into the live engine
                old = next(iter(held.values()))
                held.clear()
                old.engine.load_weights(checkpoint)
                if fresh and getattr(old.engine, "model", None) is not old.model:  # hf: the same model
                    restore_weights(checkpoint, old.model)
                pol = Policy(checkpoint, old.model, old.tokenizer, old.chat, old.engine)
            else:
                model, tokenizer = load_policy(checkpoint)
                model.to(torch_device(cfg))
                chat = ChatFormat(tokenizer, template=cfg.model.chat_template,
                                  enable_thinking=cfg.model.enable_thinking)
                eng = engine_class(engine).for_policy(model=model, checkpoint=checkpoint, chat=chat,
                                                      seed=cfg.run.seed, config=cfg)
                pol = Policy(checkpoint, model, tokenizer, chat, eng)
            held[checkpoint] = pol
            return pol

    def forget(self) -> None:
        """Drop the held policy: the next ``get`` builds it from the checkpoint afresh."""
        with self._lock:
            self._held.clear()
