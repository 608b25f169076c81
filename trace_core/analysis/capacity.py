"""Capacity plan: memory per GPU of the policy update and of the vLLM engine, before any run.

``trace-rl plan --config FILE`` prints it. Every figure is a formula of the model's shape and the
config, and every assumption is printed with the figures (``Plan.assumptions``). The update's
formulas are the ones ``scripts/update_memory.py`` checks against measured peak RSS on CPU.

The update (``trace_core.policy.update`` / ``policy.distributed``) trains float32 weights
(``load_policy`` casts the checkpoint to float32 whatever ``model.dtype`` is) with float32 AdamW
moments, so a parameter costs 4 B of weight, 4 B of gradient, 8 B of moments and, during
``optimizer.step``, 4 B of the foreach ``sqrt`` temporary; FSDP2 divides all four by the world size
and adds the unsharded working set (the root unit — embeddings, head, final norm — for the whole
forward and backward, two decoder blocks, and their unsharded gradients before the reduce-scatter);
DDP keeps everything whole and adds its gradient buckets (another 4 B a parameter).

Activations, per token of one micro-batch (counted from the tensors autograd saves in a Qwen3
decoder block, ``tests/analysis/test_capacity_plan.py``), in floats: ``6h + 4I + 4q + 4kv + 2·heads + kv_heads + 2``
a block without checkpointing, ``h`` with it (plus one block recomputed in backward), ``4h`` after
the last block, and the vocabulary log-softmax: three ``positions × V`` float32 tensors alive at
its peak (logits, scaled logits, log-probs in forward; the saved log-probs and two gradients in
backward), positions = the micro-batch's tokens or ``micro_batch × logprob_chunk`` (measured: 3.0
copies at 2,048 tokens of the 151,936 vocabulary). Attention is assumed flash-style (no L² term: true of SDPA on CPU
and of the flash / memory-efficient kernels on GPU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trace_core.config import TrainConfig
from trace_core.policy.config import TINY_WARM_DIR

GIB = 1024**3
PROMPT_TOKENS = 512  # assumed prompt length (system prompt with full tool schemas + question)
VLLM_RESERVE_GIB = 2.0  # vLLM activations / sampler / CUDA graphs inside its share (assumed)
SLEEP_RESIDUE_GIB = 1.0  # what a sleeping colocated vLLM still holds (CUDA context, allocator; assumed)


@dataclass(frozen=True)
class Shape:
    """The sizes of a Qwen3-style decoder that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def block_params(self) -> int:
        """q, k, v, o projections, the SwiGLU MLP, two RMSNorms and the q/k norms (no biases)."""
        h = self.hidden
        return h * self.q_dim * 2 + h * self.kv_dim * 2 + 3 * h * self.intermediate + 2 * h + 2 * self.head_dim

    @property
    def root_params(self) -> int:
        """Embeddings, the head (unless tied) and the final norm: FSDP's root unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.root_params + self.layers * self.block_params

    def block_floats_per_token(self) -> int:
        """Floats autograd saves per token in one decoder block (no checkpointing)."""
        return (6 * self.hidden + 4 * self.intermediate + 4 * self.q_dim + 4 * self.kv_dim
                + 2 * self.heads + self.kv_heads + 2)

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> float:
        """K and V of every layer for one token, split over ``tp`` tensor-parallel ranks."""
        return 2 * self.layers * self.kv_dim * dtype_bytes / max(1, min(tp, self.kv_heads))


# Published config.json sizes of the dense Qwen3 models (vocabulary 151,936; head_dim 128)
KNOWN_QWEN3: dict[str, Shape] = {
    "qwen3-0.6b": Shape(1024, 28, 16, 8, 128, 3072, 151_936, True),
    "qwen3-1.7b": Shape(2048, 28, 16, 8, 128, 6144, 151_936, True),
    "qwen3-4b": Shape(2560, 36, 32, 8, 128, 9728, 151_936, True),
    "qwen3-8b": Shape(4096, 36, 32, 8, 128, 12288, 151_936, False),
    "qwen3-14b": Shape(5120, 40, 40, 8, 128, 17408, 151_936, False),
    "qwen3-32b": Shape(5120, 64, 64, 8, 128, 25600, 151_936, False),
}
_HF = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
       "intermediate_size", "vocab_size", "tie_word_embeddings")


def model_shape(cfg: TrainConfig) -> tuple[Shape, str]:
    """``(shape, where it came from)``: the config.json of the model the run loads (``model.path``, or
    the shipped checkpoint), else a known Qwen3 size named by the directory (the plan runs before the
    model is copied there)."""
    m = cfg.model
    path = Path(m.path) if m.path else TINY_WARM_DIR  # what the run loads
    if m.path is None and not (path / "config.json").is_file():
        return Shape(m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size,
                     m.vocab_size, m.tie_embeddings), "the model section's sizes"
    if (path / "config.json").is_file():
        hf = json.loads((path / "config.json").read_text())
        hf.setdefault("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
        hf.setdefault("tie_word_embeddings", False)
        return Shape(*(hf[k] for k in _HF)), f"{path / 'config.json'}"
    known = KNOWN_QWEN3.get(path.name.lower())
    if known is None:
        raise ValueError(f"model.path {m.path} has no config.json here and {path.name!r} is not a known Qwen3 size "
                         f"({', '.join(KNOWN_QWEN3)}); copy the model's config.json there first")
    return known, f"{path.name}'s published config.json ({m.path} is not on this machine)"


def seq_len(cfg: TrainConfig) -> int:
    """Longest sequence the update sees: the prompt plus one episode, within the model's context."""
    limit = cfg.vllm.max_model_len or cfg.model.max_position_embeddings
    return min(limit, PROMPT_TOKENS + cfg.env.max_tokens_per_episode)


@dataclass
class UpdateMemory:
    """Bytes per rank of the update at its peak; ``terms`` in print order."""

    terms: dict[str, float] = field(default_factory=dict)

    @property
    def peak(self) -> float:
        t = self.terms
        static = t["weights"] + t["gradients"] + t["AdamW moments"] + t.get("FSDP unsharded working set", 0.0) \
            + t.get("DDP gradient buckets", 0.0)
        return static + max(t["optimizer step temporaries"], t["activations"] + t["log-prob peak"])


def update_memory(shape: Shape, *, tokens: int, micro_batch: int, world_size: int, strategy: str,
                  checkpointing: bool, chunk: int, act_bytes: int = 4) -> UpdateMemory:
    """Peak bytes on one rank for a micro-batch of ``tokens`` positions (``micro_batch`` sequences)."""
    p, w = shape.params, (world_size if strategy == "fsdp" else 1)
    terms = {"weights": 4 * p / w, "gradients": 4 * p / w, "AdamW moments": 8 * p / w,
             "optimizer step temporaries": 4 * p / w}
    if strategy == "fsdp" and world_size > 1:
        terms["FSDP unsharded working set"] = 4 * (2 * shape.root_params + 3 * shape.block_params)
    if strategy == "ddp" and world_size > 1:
        terms["DDP gradient buckets"] = 4 * p
    per_block = shape.block_floats_per_token()
    if checkpointing:
        floats = shape.layers * shape.hidden + per_block  # block inputs + one block recomputed
    else:
        floats = shape.layers * per_block
    floats += 4 * shape.hidden  # the saved log-probs are the log-prob peak's (below)
    terms["activations"] = act_bytes * tokens * floats
    positions = min(tokens, micro_batch * chunk) if chunk else tokens
    terms["log-prob peak"] = 3 * 4 * positions * shape.vocab  # float32 whatever the autocast
    return UpdateMemory(terms)


@dataclass
class EngineMemory:
    weights: float
    budget: float
    reserve: float
    kv_per_token: float

    @property
    def kv_cache(self) -> float:
        return self.budget - self.weights - self.reserve

    @property
    def kv_tokens(self) -> int:
        return max(0, int(self.kv_cache // self.kv_per_token))


def engine_memory(shape: Shape, cfg: TrainConfig, gpu_bytes: float) -> EngineMemory:
    tp = cfg.vllm.tensor_parallel_size
    dtype_bytes = 4 if cfg.model.dtype == "float32" else 2
    return EngineMemory(weights=shape.params * dtype_bytes / tp, budget=cfg.vllm.gpu_memory_utilization * gpu_bytes,
                        reserve=VLLM_RESERVE_GIB * GIB, kv_per_token=shape.kv_bytes_per_token(dtype_bytes, tp))
