"""vLLM engine for the GPU worker: prefix caching, ``n`` samples per request, colocated training.

vLLM cannot be installed beside this stack (its torch / transformers / fastapi pins conflict
with prefect's), so it is imported only when this engine is built, in the GPU worker's own
environment. The colocation pattern follows TRL's ``vllm_mode="colocate"``:

* ``LLM(..., enable_prefix_caching=True, enable_sleep_mode=True)`` in the trainer's process,
  sharing the GPU (``gpu_memory_utilization`` leaves room for the optimizer);
* before the update ``llm.sleep(level=1)`` offloads weights and drops the KV cache; after it
  ``llm.wake_up()``, then the new weights are pushed into the worker's model with
  ``model.load_weights(iter of (name, tensor))`` and the prefix cache is reset (cached blocks
  hold activations of the old weights).

Requests carry token ids (``TokensPrompt``), so the chat format and the node table stay
identical to the HF engine's. ``logprobs=0`` returns the sampled token's log-prob.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_core.engines.base import GenRequest, GenResult, SamplingConfig, sample_seed

VLLM_MISSING = ("vLLM cannot be installed beside this stack (torch/transformers/fastapi pins conflict with "
                "prefect); runs in the GPU worker environment")


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(VLLM_MISSING) from exc
    return vllm


class VLLMEngine:
    """``vllm.LLM`` behind the engine protocol.

    Args:
        model_path: local HF model directory (never a hub name: nothing is downloaded).
        chat: ``ChatFormat`` (stop ids / strings, decoding).
        gpu_memory_utilization: share of GPU memory vLLM may take (colocated: leave the rest to training).
        max_model_len: longest episode in tokens.
        enable_sleep_mode: allow ``sleep``/``wake`` (colocated training).
        llm_kwargs: extra ``vllm.LLM`` arguments (tensor_parallel_size, dtype, ...).
    """

    name = "vllm"

    @classmethod
    def for_policy(cls, *, model: Any, checkpoint: str | Path, chat: Any, seed: int = 0) -> VLLMEngine:
        """The engine of a training run: vLLM loads the checkpoint itself (the trainer's ``model``
        stays with the trainer; its weights are pushed in by ``load_weights`` after updates)."""
        return cls(checkpoint, chat, seed=seed)

    def __init__(self, model_path: str | Path, chat: Any, *, gpu_memory_utilization: float = 0.3,
                 max_model_len: int = 4096, enable_sleep_mode: bool = True, seed: int = 0,
                 llm_kwargs: dict[str, Any] | None = None) -> None:
        vllm = _import_vllm()
        self.chat = chat
        self._vllm = vllm
        self.sleeping = False
        self.llm = vllm.LLM(
            model=str(model_path), tokenizer=str(model_path), enable_prefix_caching=True,
            enable_sleep_mode=enable_sleep_mode, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, seed=seed, **(llm_kwargs or {}),
        )

    def _params(self, req: GenRequest, sampling: SamplingConfig) -> Any:
        return self._vllm.SamplingParams(
            n=req.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,  # -1 = off in vLLM
            max_tokens=sampling.max_new_tokens,
            seed=sample_seed(sampling.seed, req.seed, 0) % (2**31),
            logprobs=0,  # the sampled token's own log-prob
            stop_token_ids=sorted(self.chat.stop_token_ids),
            stop=list(self.chat.stop_strings) or None,
            include_stop_str_in_output=True,  # the action keeps its stop marker, as in the HF engine
            skip_special_tokens=False,
        )

    def generate(self, requests: list[GenRequest], sampling: SamplingConfig) -> list[list[GenResult]]:
        if self.sleeping:
            self.wake()
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        params = [self._params(r, sampling) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[self._result(c) for c in out.outputs] for out in outputs]

    def _result(self, comp: Any) -> GenResult:
        ids = list(comp.token_ids)
        lps = [float(d[t].logprob) for t, d in zip(ids, comp.logprobs or [], strict=False)]
        if len(lps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
        finish = "stop" if comp.finish_reason == "stop" else "length"
        return GenResult(tuple(ids), self.chat.decode(ids), tuple(lps), finish)

    def load_weights(self, checkpoint: str | Path | dict[str, Any]) -> None:
        """Push new weights into the running engine (no restart), then drop stale cached prefixes."""
        from trace_core.policy.checkpoint import load_model_state

        state = load_model_state(checkpoint) if isinstance(checkpoint, str | Path) else checkpoint
        if self.sleeping:
            self.wake()
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(weights=state.items())
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        if not self.sleeping:
            self.llm.sleep(level=1)  # weights to CPU RAM, KV cache dropped
            self.sleeping = True

    def wake(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False
