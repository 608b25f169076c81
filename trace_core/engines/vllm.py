"""vLLM engine: prefix caching, one request per sample, weights pushed in after each update.

vLLM cannot be installed beside this stack (its fastapi pin conflicts with prefect's), so it is
imported only when this engine is built, in the worker environment (``scripts/vllm-cpu-env.sh``
builds the CPU one; a GPU worker installs ``vllm``). The pattern follows TRL's colocate mode and
its ``vllm_serve`` weight sync:

* ``LLM(..., enable_prefix_caching=True, worker_extension_cls=...)``: vLLM mixes
  ``WeightPushExtension`` into its worker class, so ``llm.collective_rpc("trace_load_checkpoint",
  args=(path,))`` runs vLLM's in-place weight reload inside every worker (every tensor-parallel
  rank, and across the process boundary when the engine core runs in a child process);
* after a push the prefix cache is reset: cached blocks hold activations of the old weights;
* ``logprobs_mode="processed_logprobs"``: the returned log-prob is that of the temperature-scaled
  distribution, as the update's ratio needs (``raw_logprobs`` would ignore the temperature);
* GPU: ``sleep`` offloads weights and drops the KV cache while the colocated trainer updates. The
  CPU build has no sleep mode (its worker logs "not supported" and ignores it), so there ``sleep``
  and ``wake`` do nothing.

Requests carry token ids, so the chat format and node table are the HF engine's. Each sample is its
own request seeded by ``sample_seed(sampling.seed, request.seed, j)`` (as in the HF engine): a
sample does not depend on which other requests share the batch. Prefix caching reuses the KV
blocks of contexts computed before (an episode's earlier turns, the prefix an extension continues).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_core.engines.base import GenRequest, GenResult, sample_seed
from trace_core.engines.config import SamplingConfig, VLLMConfig
from trace_core.policy.checkpoint import load_model_state
from trace_core.policy.modeldir import check_model_dir
from trace_core.stages.run import bounded_seed

VLLM_MISSING = "needs vLLM: run inside the environment scripts/vllm-cpu-env.sh builds"
log = logging.getLogger(__name__)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:  # depends on the environment
        raise ImportError(VLLM_MISSING) from exc
    return vllm


@contextlib.contextmanager
def _modules_vllm_can_scan() -> Iterator[None]:
    """vLLM's CPU platform rebinds kernels by scanning the globals of every imported module and
    reading ``vars(value)`` of each. llvmlite's FFI wrappers (imported with numba, which bm25s
    loads for the QA search when it is installed, as in the vLLM environment) answer any attribute,
    ``__dict__`` included, so the scan fails and the engine does not start. Modules holding such
    values leave ``sys.modules`` while the engine is built and come back after."""
    hidden = {}
    for name, mod in list(sys.modules.items()):
        if name in sys.builtin_module_names:
            continue
        for value in list(getattr(mod, "__dict__", {}).values()):
            try:  # the scan's own test: vars(value).get(...)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # deprecated attributes warn when touched
                    odd = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
            except Exception:  # an attribute that fails to load is vLLM's scan's business, not ours
                odd = False
            if odd:
                hidden[name] = mod
                break
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class WeightPushExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); called by name through
    ``llm.collective_rpc``. Names carry a ``trace_`` prefix: vLLM rejects a clash with a worker attribute."""

    def trace_load_checkpoint(self, path: str) -> int:
        """Load the safetensors weights of a checkpoint directory; returns the number of tensors."""
        return self.trace_load_state(load_model_state(path))

    def trace_load_state(self, state: dict[str, Any]) -> int:
        """Load ``{name: tensor}`` (HF parameter names). vLLM's in-place reload maps them onto its fused
        layers and redoes the post-load processing (the CPU build repacks linear weights for its
        kernels, leaving the loaded parameters empty: a plain ``model.load_weights`` fails there)."""
        hf_config = self.vllm_config.model_config.hf_config  # type: ignore[attr-defined]
        tied = getattr(hf_config, "tie_word_embeddings", False)
        if tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
            # a tied head is saved once, as the embedding; the in-place reload rebuilds lm_head as
            # its own parameter and leaves it stale unless it is given the weights too
            state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(state)


class VLLMEngine:
    """``vllm.LLM`` behind the engine protocol.

    Args:
        model_path: local HF model directory (never a hub name: nothing is downloaded).
        chat: ``ChatFormat`` (stop ids / strings, decoding).
        config: ``VLLMConfig`` (tensor parallel size, memory share, max length, eager, in-process).
        dtype: weights dtype (``model.dtype`` of the run; float32 for the tiny model on CPU).
        llm_kwargs: further ``vllm.LLM`` arguments (e.g. ``max_num_seqs``).
    """

    name = "vllm"

    @classmethod
    def for_policy(cls, *, model: Any, checkpoint: str | Path, chat: Any, seed: int = 0,
                   config: Any = None) -> VLLMEngine:
        """The engine of a training run: vLLM loads the checkpoint itself (the trainer's ``model``
        stays with the trainer; its weights are pushed in by ``load_weights`` after updates).
        ``config``: the run's ``TrainConfig`` (its ``vllm`` section and ``model.dtype``)."""
        vcfg = getattr(config, "vllm", None) or VLLMConfig()
        dtype = config.model.dtype if config is not None else "float32"
        return cls(checkpoint, chat, config=vcfg, dtype=dtype, seed=seed)

    def __init__(self, model_path: str | Path, chat: Any, *, config: VLLMConfig | None = None,
                 dtype: str = "float32", seed: int = 0, llm_kwargs: dict[str, Any] | None = None) -> None:
        cfg = config or VLLMConfig()
        vllm = _import_vllm()
        # vLLM reads these when the engine is built; they apply to the whole process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if cfg.multiprocessing else "0"
        from vllm.platforms import current_platform

        self.on_cpu = bool(current_platform.is_cpu())
        kwargs: dict[str, Any] = {}
        if self.on_cpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_gib)
            # a prompt prefilled in chunks makes the CPU worker rewind a seeded request's generator,
            # which CPU generators cannot do ("CPU Generator does not use offset"): prefill whole prompts
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(4096, cfg.max_model_len or 0))
        else:
            kwargs.update(gpu_memory_utilization=cfg.gpu_memory_utilization,
                          enable_sleep_mode=cfg.enable_sleep_mode)
        self.can_sleep = cfg.enable_sleep_mode and not self.on_cpu
        if self.on_cpu and cfg.enable_sleep_mode:
            log.info("vLLM's CPU build has no sleep mode: sleep() and wake() do nothing")
        # only an in-process, single-worker engine calls its worker directly; otherwise collective_rpc
        # serialises its arguments, which tensors do not survive: a state dict then travels as a file
        self._direct = not cfg.multiprocessing and cfg.tensor_parallel_size == 1
        self.chat = chat
        self._vllm = vllm
        self.sleeping = False

        check_model_dir(model_path)  # safetensors and JSON only
        with _modules_vllm_can_scan():
            self.llm = vllm.LLM(
                model=str(model_path), tokenizer=str(model_path), dtype=dtype, seed=seed,
                tensor_parallel_size=cfg.tensor_parallel_size, max_model_len=cfg.max_model_len,
                enforce_eager=cfg.enforce_eager, enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",  # temperature-scaled, as the update's ratio compares
                worker_extension_cls=f"{__name__}.WeightPushExtension",
                **{"load_format": "safetensors", **kwargs, **(llm_kwargs or {})},  # never a pickled checkpoint
            )

    # -- protocol ---------------------------------------------------------------------------
    def generate(self, requests: list[GenRequest], sampling: SamplingConfig) -> list[list[GenResult]]:
        if sampling.temperature > 0 and (sampling.top_k > 0 or sampling.top_p < 1.0):
            # vLLM's processed log-probs are renormalised after filtering; the update's ratio compares
            # against the unfiltered temperature-scaled distribution (GenResult.logprobs)
            raise ValueError(f"the vllm engine needs sampling.top_k=0 and sampling.top_p=1.0 "
                             f"(got top_k={sampling.top_k}, top_p={sampling.top_p})")
        if any(len(r.prompt_ids) == 0 for r in requests):
            raise ValueError("every request needs a non-empty prompt")
        self.wake()
        rows = [(i, j) for i, r in enumerate(requests) for j in range(r.n)]
        prompts = [{"prompt_token_ids": list(requests[i].prompt_ids)} for i, _ in rows]
        params = [self._params(sampling, requests[i].seed, j) for i, j in rows]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results: list[list[GenResult]] = [[] for _ in requests]
        for (i, _), out in zip(rows, outputs, strict=True):
            results[i].append(self._result(out.outputs[0]))
        return results

    def load_weights(self, checkpoint: str | Path | dict[str, Any]) -> None:
        """Push new weights into the running engine (no restart), then drop stale cached prefixes.
        A checkpoint directory travels as its path (each worker reads it); a state dict as tensors
        (in-process engine) or as a temporary safetensors file (engine core or workers in child
        processes, on this host)."""
        self.wake()
        if isinstance(checkpoint, str | Path):
            counts = self.llm.collective_rpc("trace_load_checkpoint", args=(str(checkpoint),))
        elif self._direct:
            counts = self.llm.collective_rpc("trace_load_state", args=(dict(checkpoint),))
        else:
            counts = self._push_via_file(checkpoint)
        if not counts or min(counts) == 0:
            raise ValueError(f"no weights loaded from {checkpoint if isinstance(checkpoint, str | Path) else 'state'}")
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests still running)")

    def _push_via_file(self, state: dict[str, Any]) -> list[int]:
        import tempfile

        from safetensors.torch import save_file

        unique, seen = {}, set()
        # a tied head shares the embedding's storage: saved once, as the embedding
        for name, t in sorted(state.items(), key=lambda kv: kv[0].startswith("lm_head")):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                unique[name] = t.detach().cpu().contiguous()
        with tempfile.TemporaryDirectory(prefix="trace-vllm-push-") as tmp:
            save_file(unique, str(Path(tmp) / "model.safetensors"))
            return self.llm.collective_rpc("trace_load_checkpoint", args=(tmp,))

    def sleep(self) -> None:
        if self.can_sleep and not self.sleeping:
            self.llm.sleep(level=1)  # weights to host RAM, KV cache dropped
            self.sleeping = True

    def wake(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    # -- internals ---------------------------------------------------------------------------
    def _params(self, sampling: SamplingConfig, request_seed: int, index: int) -> Any:
        return self._vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            max_tokens=sampling.max_new_tokens,
            seed=bounded_seed(sample_seed(sampling.seed, request_seed, index)),
            logprobs=0,  # the sampled token's own log-prob
            stop_token_ids=sorted(self.chat.stop_token_ids),
            stop=list(self.chat.stop_strings) or None,
            include_stop_str_in_output=True,  # the action keeps its stop marker, as in the HF engine
            skip_special_tokens=False,
            detokenize=bool(self.chat.stop_strings),  # text comes from chat.decode; vLLM needs it for stop strings
        )

    def _result(self, comp: Any) -> GenResult:
        ids = list(comp.token_ids)
        lps = [float(d[t].logprob) for t, d in zip(ids, comp.logprobs or [], strict=False)]
        if len(lps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
        finish = "stop" if comp.finish_reason == "stop" else "length"
        return GenResult(tuple(ids), self.chat.decode(ids), tuple(lps), finish)
