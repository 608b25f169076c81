"""Configuration of the policy: model sizes or path, tokenizer training, SFT warm start and the
policy-gradient update (the ``model``, ``warmup`` and ``update`` sections of a run config).

Pure pydantic: importing this module (and so ``trace_core.config``) loads no torch or
transformers; the code that uses each model lives beside it (``model``, ``tokenizer``,
``warmup``, ``update``), which re-export their config for existing imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The warm-started tiny checkpoint shipped with the package (``trace-rl warmup`` rebuilds it).
TINY_WARM_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny-warm"


class ModelConfig(BaseModel):
    """Policy model: sizes of the tiny Qwen3, or ``path`` to a local HF model directory.

    Default sizes are the prototype's (3.4M parameters with a 1024 vocab): big enough to reach
    ~35% sampled success after ~16 CPU-minutes of SFT, small enough to sample fast on CPU. A
    10.7M variant learned more slowly per wall-clock minute there.
    """

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(
        None, description="Local directory of a HF causal LM + tokenizer (e.g. Qwen3-8B). None: the shipped "
        "tiny-warm checkpoint when loading; the sizes below when building from scratch (warm-up).")
    hidden_size: int = Field(256, ge=8, le=16384, description="Residual width.")
    num_layers: int = Field(4, ge=1, le=128, description="Decoder blocks.")
    num_heads: int = Field(4, ge=1, le=128, description="Query heads.")
    num_kv_heads: int = Field(2, ge=1, le=128, description="Key/value heads (grouped-query attention).")
    head_dim: int = Field(64, ge=8, le=512, description="Per-head width (Qwen3 decouples it from hidden/heads).")
    intermediate_size: int = Field(768, ge=8, le=65536, description="SwiGLU FFN width (~3x hidden).")
    vocab_size: int = Field(1024, ge=16, le=262144, description="Must match the tokenizer (tiny: 1024).")
    max_position_embeddings: int = Field(2048, ge=64, le=131072, description="Longest episode in tokens.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base; 1e4 is plenty for ~1k-token episodes.")
    tie_embeddings: bool = Field(True, description="Share input and output embeddings (halves the 1024x256 tables).")
    dtype: str = Field("float32", pattern="^(float32|bfloat16|float16)$",
                       description="Weights dtype after loading; float32 for CPU training (bf16 via autocast).")
    chat_template: Literal["builtin", "tokenizer"] = Field(
        "builtin", description="'builtin': the project's Qwen3-style chat text (the tiny tokenizer has no template); "
        "'tokenizer': the model's own chat template (apply_chat_template), for real Qwen3 checkpoints.")
    enable_thinking: bool | None = Field(
        None, description="Passed to the chat template as enable_thinking (Qwen3: False = an empty think block, "
        "True = the model reasons in <think> first); None = the template's default. Only with chat_template=tokenizer.")


# ModelConfig field <- key of a Hugging Face config.json (the sizes a loaded checkpoint brings)
_HF_SIZE_KEYS = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                 "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
                 "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
                 "max_position_embeddings": "max_position_embeddings", "tie_embeddings": "tie_word_embeddings"}


def checkpoint_sizes(path: str | Path) -> dict:
    """The ``ModelConfig`` sizes of the checkpoint at ``path`` as its ``config.json`` states them
    (a loaded model has these, whatever the config's size fields say: they only build a new one).
    Keys the file lacks are left out; ``rope_theta`` from ``rope_parameters`` or the flat key."""
    import json

    hf = json.loads((Path(path) / "config.json").read_text())
    out = {ours: hf[theirs] for ours, theirs in _HF_SIZE_KEYS.items() if theirs in hf}
    if (theta := (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta"))) is not None:
        out["rope_theta"] = theta
    return out


class TokenizerConfig(BaseModel):
    """How the tiny tokenizer is trained."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(1024, ge=300, le=65536, description="Total vocabulary incl. 256 byte symbols and specials.")
    min_frequency: int = Field(2, ge=1, le=1000, description="A merge must occur this often in the corpus.")


class WarmupConfig(BaseModel):
    """SFT warm start of the tiny policy."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(3000, ge=1, le=1_000_000, description="Optimizer steps (~20 CPU-minutes at the default size).")
    batch_size: int = Field(16, ge=1, le=1024, description="Episodes per step.")
    lr: float = Field(2e-3, gt=0, le=1.0, description="Peak AdamW learning rate (tiny models take a high one).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine floor as a share of lr (~lr/10).")
    warmup_steps: int = Field(100, ge=0, le=100_000, description="Linear ramp from 0 to lr.")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW decoupled weight decay.")
    grad_clip: float = Field(1.0, gt=0, le=100, description="Global grad-norm clip.")
    bf16_autocast: Literal["auto", "on", "off"] = Field(
        "auto", description="bf16 autocast: 1.7-1.9x faster than fp32 on a CPU with native bf16 (AVX512-BF16 / AMX), "
        "but ~20x *slower* on AVX2-only CPUs (measured here); 'auto' uses it only where it is native or on CUDA.")
    bucket_batches: int = Field(32, ge=1, le=4096,
                                description="Batches pooled and sorted by length before cutting (1 = unsorted).")
    families: dict[str, float] = Field(default_factory=lambda: {"math": 1.0, "qa": 1.0, "fc": 1.0},
                                       description="Mix weights of the families in the demos.")
    difficulties: list[int] = Field(default_factory=lambda: [0, 1, 2, 3],
                                    description="Difficulty levels drawn uniformly for the demos.")
    seed: int = Field(0, ge=0, description="Seeds the demo stream, the init and the batch order.")
    num_threads: int = Field(1, ge=1, le=256, description="torch CPU threads. On a shared, oversubscribed CPU one "
                             "thread measured ~4x faster than two (1200 vs 310 tokens/s).")
    device: str = Field("cpu", pattern="^(cpu|cuda(:[0-9]+)?)$", description="Where SFT runs.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="Tokenizer training.")
    tokenizer_demos: int = Field(3000, ge=10, le=1_000_000, description="Demos the tokenizer is trained on.")
    log_every: int = Field(50, ge=1, le=100_000, description="Steps between log lines.")
    init_from: str | None = Field(
        None, description="Continue SFT from this checkpoint directory (its weights and tokenizer; model sizes "
        "are ignored) instead of building a fresh model. Its recipe is kept under 'stages' in the new one.")
    save_every: int = Field(0, ge=0, le=1_000_000, description="Steps between interim saves (0 = only at the end).")


class UpdateConfig(BaseModel):
    """One policy update over a batch of trajectories."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(3e-4, gt=0, le=1.0, description="AdamW learning rate (tiny model: 3e-4; 5e-5 barely moved it).")
    weight_decay: float = Field(0.0, ge=0, le=1.0, description="AdamW decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    warmup_steps: int = Field(0, ge=0, le=100_000, description="Linear LR warm-up in optimizer steps.")
    clip_eps: float = Field(0.2, gt=0, le=1.0, description="PPO clip range ε (lower side).")
    clip_eps_high: float | None = Field(None, gt=0, le=1.0, description="Upper clip (DAPO clip-higher); None = clip_eps.")
    kl_coef: float = Field(0.0, ge=0, le=10.0, description="β of the k3 KL to the reference policy; 0 = no reference.")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6, description="Global gradient-norm clip.")
    minibatch_size: int = Field(64, ge=1, le=1_000_000, description="Trajectories per optimizer step.")
    micro_batch_size: int = Field(16, ge=1, le=100_000,
                                  description="Trajectories per forward pass (gradient accumulation within a minibatch).")
    ppo_epochs: int = Field(1, ge=1, le=32, description="Passes over the batch (1 = on-policy GRPO).")
    temperature: float = Field(1.0, gt=0, le=5.0, description="Logits / T before log-softmax; match the sampling temperature.")
    skip_zero_advantage: bool = Field(True, description="Drop trajectories whose loss tokens all have A = 0 "
                                      "(no policy-gradient signal; kept when kl_coef > 0).")
    autocast_bf16: bool = Field(False, description="bf16 autocast for forward passes (≈1.8× faster on CPU here).")
    gradient_checkpointing: bool = Field(False, description="Recompute each decoder block's activations in backward "
                                         "(HF gradient_checkpointing_enable): ~1/L of the activation memory for "
                                         "~1.3x the compute; what lets Qwen3-8B micro-batches fit.")
    logprob_chunk: int = Field(0, ge=0, le=1_000_000, description="Positions per chunk of the vocabulary "
                               "log-softmax, recomputed in backward (0 = all at once). Bounds the fp32 logits "
                               "to micro_batch x chunk x vocab (Qwen3: 4 x 1024 x 151,936 x 4 B = 2.5 GB).")
    off_policy: Literal["decoupled", "none"] = Field(
        "decoupled", description="Correction for rollouts generated by older weights (run.max_staleness > 0; "
        "not applied at 0). decoupled: decoupled PPO (Hilton et al. 2022, AReaL): the clip is taken around the "
        "policy at the start of the update (one extra forward pass) and each token is weighted by "
        "π_prox / π_behaviour, truncated at is_cap. none: the plain surrogate around the behaviour log-probs.")
    is_cap: float = Field(2.0, gt=0, le=1e6, description="Truncation C of the behaviour importance weight "
                          "π_prox / π_behaviour (truncated IS, as IMPALA's ρ̄ and verl's rollout correction).")
    strategy: Literal["single", "fsdp", "ddp"] = Field(
        "single", description="single: in the run's process. fsdp: FSDP2 (fully_shard per decoder block) over "
        "world_size torchrun processes; ddp: DDP there (each rank holds the whole model, for models that fit).")
    world_size: int = Field(1, ge=1, le=1024, description="Data-parallel processes (GPUs) of a fsdp / ddp update "
                            "on this machine; each trains on 1/world_size of every minibatch.")
    launch_timeout_s: float = Field(7200.0, gt=0, le=7 * 86400,
                                    description="Seconds a torchrun update may take before it is stopped.")

    @property
    def uses_reference(self) -> bool:
        """A KL term to a reference policy is on (``kl_coef > 0``): the reference is loaded and run,
        and zero-advantage sequences still train (the KL pulls them)."""
        return self.kl_coef > 0

    @model_validator(mode="after")
    def _strategy_fits_world(self) -> UpdateConfig:
        if self.world_size > 1 and self.strategy == "single":
            raise ValueError(f"update.world_size={self.world_size} needs update.strategy 'fsdp' or 'ddp', "
                             f"not 'single'")
        return self
