"""Rollout engine protocol and its lazy registry.

An engine turns token-id prompts into sampled continuations that stop at the end of one
agent action (a stop token id or stop string from ``ChatFormat``). One request may ask for
``n`` samples from the same prompt: engines encode the prompt once and share it (a repeated
KV cache in ``hf``, prefix caching in ``vllm``).

Engines are found by import path, so ``vllm`` is imported only when it is chosen::

    engine = make_engine("hf", model=model, chat=chat)
    results = engine.generate([GenRequest(prompt_ids=ids, n=8, seed=3)], SamplingConfig())
    results[0][5].token_ids   # the 6th sample of the first request
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from trace_core.engines.config import SamplingConfig
from trace_core.registry import Registry

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenRequest:
    """``n`` continuations of one token-id prompt. ``seed`` makes them reproducible: sample
    ``j`` of a request is drawn from its own generator seeded by (sampling.seed, seed, j), so it
    does not depend on which other requests share the batch."""

    prompt_ids: tuple[int, ...]
    n: int = 1
    seed: int = 0


@dataclass(frozen=True)
class GenResult:
    """One sampled action. ``logprobs[i]`` = log p(token_ids[i]) under the temperature-scaled
    policy before top-k / top-p filtering (what the policy update's ratio compares against)."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    finish_reason: FinishReason


class Engine(Protocol):
    name: str

    def generate(self, requests: list[GenRequest], sampling: SamplingConfig) -> list[list[GenResult]]:
        """One list of ``request.n`` results per request, in request order."""

    def load_weights(self, checkpoint: str | Path | dict[str, Any]) -> None:
        """Load new policy weights (a checkpoint directory or a state dict) after an update."""

    def sleep(self) -> None:
        """Release accelerator memory while the trainer runs (no-op where nothing is held)."""

    def wake(self) -> None:
        """Undo ``sleep`` before the next generation."""


_ENGINES: Registry[type] = Registry("engine", lazy={
    "hf": "trace_core.engines.hf:HFEngine",
    "vllm": "trace_core.engines.vllm:VLLMEngine",
})


def register_engine(name: str, import_path: str) -> None:
    """Register ``"package.module:ClassName"`` under ``name``; a duplicate name is rejected."""
    _ENGINES.add_lazy(name, import_path)


def engine_names() -> list[str]:
    return _ENGINES.names()


def engine_class(name: str) -> type:
    """The engine class for ``name``, imported only now (so vLLM loads only when chosen)."""
    return _ENGINES.get_item(name)


def make_engine(name: str, **kwargs: Any) -> Engine:
    return engine_class(name)(**kwargs)


def sample_seed(base: int, request_seed: int, index: int) -> int:
    """A 63-bit seed for sample ``index`` of a request (SeedSequence mixes the parts)."""
    import numpy as np

    return int(np.random.SeedSequence([base, request_seed, index]).generate_state(2, np.uint32).view(np.uint64)[0]
               >> np.uint64(1))
