"""Transformers engine: our own batched sampling loop over ``model.forward`` with a KV cache.

Why not ``model.generate``: it cannot continue *many* samples from *one* encoded prefix, it
silently applies ``top_k=50`` with ``do_sample=True``, and it has no per-sample seeds. The loop:

1. prefill each distinct prompt once (left-padded batch ``(R, L)``, explicit position ids);
2. repeat every prompt's cache rows over its ``n`` samples (``batch_select_indices`` with
   repeated indices) -- the prefix is never re-encoded (~3.7x faster for 128 continuations);
3. decode one token per step for all live rows, dropping finished rows from the cache.

Per-step costs kept down without changing a single sampled token (same seeds, same outputs):
the KV cache reserves room for ``max_new_tokens`` at prefill and writes each new token in place
(``_ReservedLayer``; transformers' ``DynamicLayer`` copies every row's whole cache, per layer, at
every step), and the per-row ``torch.multinomial`` calls are one batched ``argmax(p / q)`` over the
same ``Exp(1)`` draws. K = 8 continuations x 24 tokens of a 400-token prefix went from 2.8x to 3.1x
faster than re-encoding the prefix per sample (CPU time, ``benchmarks/speed/bench_engine.py``); what is
left of a decode step is the model's own forward (~1 ms of module overhead plus attention over
the prefix, which every row reads in full).

Each sample has its own ``torch.Generator`` (seeded by ``sample_seed``), so its tokens do not
depend on which other requests share the batch.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any

import torch

from trace_core.engines.base import GenRequest, GenResult, sample_seed
from trace_core.engines.config import SamplingConfig
from trace_core.policy.checkpoint import load_model_state

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - transformers without layered caches
    DynamicLayer = None


if DynamicLayer is not None:
    class _ReservedLayer(DynamicLayer):
        """A full-attention KV layer with ``reserve`` free positions after its tokens: an update
        writes into them in place; ``keys`` / ``values`` are views ``[:, :, :length]`` of the buffers."""

        def __init__(self, reserve: int) -> None:
            super().__init__()
            self.reserve = reserve
            self._kbuf: torch.Tensor | None = None
            self._vbuf: torch.Tensor | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, m = self.get_seq_length(), key_states.shape[-2]
            if self._kbuf is None or n + m > self._kbuf.shape[-2] or self._kbuf.shape[0] != key_states.shape[0]:
                kbuf = key_states.new_empty((*key_states.shape[:2], n + m + self.reserve, key_states.shape[-1]))
                vbuf = value_states.new_empty((*value_states.shape[:2], n + m + self.reserve, value_states.shape[-1]))
                if n:
                    kbuf[:, :, :n] = self.keys
                    vbuf[:, :, :n] = self.values
                self._kbuf, self._vbuf = kbuf, vbuf
            self._kbuf[:, :, n:n + m] = key_states
            self._vbuf[:, :, n:n + m] = value_states
            self.keys, self.values = self._kbuf[:, :, :n + m], self._vbuf[:, :, :n + m]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self._kbuf is not None and self.get_seq_length() > 0:
                n = self.get_seq_length()
                self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
                self.keys, self.values = self._kbuf[:, :, :n], self._vbuf[:, :, :n]

        def reset(self) -> None:
            self._kbuf = self._vbuf = None
            super().reset()


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering of ``(B, V)`` logits; removed entries -> -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the mass *before* it already reaches top_p (the top token always stays)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class HFEngine:
    """Batched sampling with any HF causal LM (CPU or GPU).

    Args:
        model: a ``*ForCausalLM`` (shared with the trainer when colocated: then no reload).
        chat: a ``ChatFormat`` (stop ids / strings, pad id, decoding).
        max_batch_rows: samples decoded together; larger batches are split by request.
        share_prefix: False re-encodes the prompt for every sample (the plain path, kept for
            benchmarks and the equivalence test).
        autocast_dtype: e.g. ``torch.bfloat16`` to run forward passes under autocast.
    """

    name = "hf"

    @classmethod
    def for_policy(cls, *, model: Any, checkpoint: str | Path, chat: Any, seed: int = 0,
                   config: Any = None) -> HFEngine:
        """The engine of a training run: it samples from the trainer's own model (colocated).
        ``config`` (the run's ``TrainConfig``) is not needed here."""
        return cls(model, chat)

    def __init__(self, model: Any, chat: Any, *, max_batch_rows: int = 256, share_prefix: bool = True,
                 autocast_dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.chat = chat
        self.max_batch_rows = max_batch_rows
        self.share_prefix = share_prefix
        self.autocast_dtype = autocast_dtype
        # transformers renamed forward's cache argument (past_key_values < 5.20 <= cache); an unknown
        # name would be swallowed by **kwargs and every step would decode without its context
        params = inspect.signature(type(model).forward).parameters
        self._cache_arg = "past_key_values" if "past_key_values" in params else "cache"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- protocol ---------------------------------------------------------------------------
    def generate(self, requests: list[GenRequest], sampling: SamplingConfig) -> list[list[GenResult]]:
        out: list[list[GenResult]] = [[] for _ in requests]
        for chunk in self._chunks(requests):
            for i, res in zip(chunk, self._generate_chunk([requests[i] for i in chunk], sampling), strict=True):
                out[i] = res
        return out

    def load_weights(self, checkpoint: str | Path | dict[str, Any]) -> None:
        state = load_model_state(checkpoint) if isinstance(checkpoint, str | Path) else checkpoint
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = {k for k in missing if "lm_head" in k}  # tied embeddings are saved once
        if set(missing) - tied or unexpected:
            raise ValueError(f"checkpoint does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")

    def sleep(self) -> None:  # the HF model is the trainer's own: nothing to release
        return None

    def wake(self) -> None:
        return None

    # -- internals ---------------------------------------------------------------------------
    def _chunks(self, requests: list[GenRequest]) -> list[list[int]]:
        chunks: list[list[int]] = [[]]
        rows = 0
        for i, r in enumerate(requests):
            if chunks[-1] and rows + r.n > self.max_batch_rows:
                chunks.append([])
                rows = 0
            chunks[-1].append(i)
            rows += r.n
        return [c for c in chunks if c]

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _new_cache(self, reserve: int) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if DynamicLayer is not None:  # full-attention layers get in-place room for the new tokens
            cache.layers = [_ReservedLayer(reserve) if type(layer) is DynamicLayer else layer
                            for layer in cache.layers]
        return cache

    def _prefill(self, prompts: list[tuple[int, ...]],
                 reserve: int = 0) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Left-padded prefill of ``R`` prompts -> (last logits (R, V), cache, mask (R, L), next pos (R,)).
        ``reserve``: KV positions kept free for the tokens to come."""
        dev, pad = self.device, self.chat.pad_token_id
        length = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), length), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), length), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, length - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        cache = self._new_cache(reserve)
        with self._autocast():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                             **{self._cache_arg: cache})
        return out.logits[:, -1].float(), cache, mask, pos[:, -1] + 1

    @torch.inference_mode()
    def _generate_chunk(self, reqs: list[GenRequest], sampling: SamplingConfig) -> list[list[GenResult]]:
        if any(len(r.prompt_ids) == 0 for r in reqs):
            raise ValueError("every request needs a non-empty prompt")
        was_training = self.model.training
        self.model.eval()
        rows = [(i, j) for i, r in enumerate(reqs) for j in range(r.n)]
        if self.share_prefix:  # encode each prompt once, then repeat its cache rows over its samples
            logits, cache, mask, pos = self._prefill([r.prompt_ids for r in reqs], sampling.max_new_tokens)
            expand = torch.tensor([i for i, _ in rows], device=logits.device)
            cache.batch_select_indices(expand)
            logits, mask, pos = logits[expand], mask[expand], pos[expand]
        else:
            logits, cache, mask, pos = self._prefill([reqs[i].prompt_ids for i, _ in rows], sampling.max_new_tokens)
        gens = [self._generator(sampling, reqs[i].seed, j) for i, j in rows]
        tokens: list[list[int]] = [[] for _ in rows]
        lps: list[list[float]] = [[] for _ in rows]
        finish: list[str] = ["length"] * len(rows)
        live = list(range(len(rows)))  # row index of each live cache row
        padded = not bool(mask[:, 0].all())  # no left padding: no 4-D mask to build each step
        for step in range(sampling.max_new_tokens):
            tok, lp = self._sample(logits, sampling, [gens[r] for r in live])
            keep = []
            for k, (r, t, x) in enumerate(zip(live, tok.tolist(), lp.tolist(), strict=True)):
                tokens[r].append(t)
                lps[r].append(x)
                if self.chat.is_stop(tokens[r]):
                    finish[r] = "stop"
                else:
                    keep.append(k)
            if not keep or step == sampling.max_new_tokens - 1:
                break
            if len(keep) < len(live):  # drop finished rows so they cost nothing further
                sel = torch.tensor(keep, device=tok.device)
                cache.batch_select_indices(sel)
                tok, pos = tok[sel], pos[sel]
                live = [live[k] for k in keep]
                if padded:  # once the padded rows are gone the mask is never needed again
                    mask = mask[sel]
                    padded = not bool(mask[:, 0].all())
            if padded:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            with self._autocast():
                out = self.model(input_ids=tok[:, None], attention_mask=mask if padded else None,
                                 position_ids=pos[:, None], use_cache=True, **{self._cache_arg: cache})
            logits = out.logits[:, -1].float()
            pos = pos + 1
        self.model.train(was_training)
        results: list[list[GenResult]] = [[] for _ in reqs]
        for r, (i, _) in enumerate(rows):
            results[i].append(GenResult(tuple(tokens[r]), self.chat.decode(tokens[r]), tuple(lps[r]),
                                        finish[r]))  # type: ignore[arg-type]
        return results

    def _generator(self, sampling: SamplingConfig, request_seed: int, index: int) -> torch.Generator | None:
        if sampling.temperature == 0:
            return None
        return torch.Generator(device=self.device).manual_seed(sample_seed(sampling.seed, request_seed, index))

    @staticmethod
    def _sample(logits: torch.Tensor, sampling: SamplingConfig,
                gens: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, V)`` logits -> (token ids (B,), their log-probs (B,))."""
        if sampling.temperature == 0:
            logp = torch.log_softmax(logits, dim=-1)
            tok = logits.argmax(-1)
            return tok, logp.gather(-1, tok[:, None])[:, 0]
        scaled = logits / sampling.temperature
        logp = torch.log_softmax(scaled, dim=-1)
        probs = torch.softmax(filter_logits(scaled, sampling.top_k, sampling.top_p), dim=-1)
        if not bool(torch.isfinite(probs).all()):
            raise ValueError("the policy produced non-finite probabilities (diverged weights?)")
        # torch.multinomial(probs[b], 1, generator=g) row by row, batched: it draws q ~ Exp(1) of the
        # row's size from g and takes argmax(p / q); the same draws give the same tokens
        q = torch.empty_like(probs)
        for b, g in enumerate(gens):
            q[b].exponential_(1.0, generator=g)
        tok = (probs / q).argmax(-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
