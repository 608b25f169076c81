"""Policy model: the tiny Qwen3 built from sizes, or any local Hugging Face causal LM by path.

Nothing is downloaded: every load passes ``local_files_only=True``. ``ModelConfig`` and
``TINY_WARM_DIR`` live in ``policy.config`` (re-exported here).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from trace_core.policy.checkpoint import check_not_retired
from trace_core.policy.config import TINY_WARM_DIR, ModelConfig
from trace_core.policy.modeldir import check_model_dir

__all__ = ["TINY_WARM_DIR", "ModelConfig", "build_model", "load_policy", "n_params", "qwen3_config"]


def qwen3_config(cfg: ModelConfig, *, pad_token_id: int = 0, eos_token_id: int = 1) -> Any:
    """The ``Qwen3Config`` for ``cfg``'s sizes."""
    from transformers import Qwen3Config

    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(f"num_heads={cfg.num_heads} must be a multiple of num_kv_heads={cfg.num_kv_heads}")
    return Qwen3Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        use_cache=True,
    )


def build_model(cfg: ModelConfig, *, seed: int = 0, pad_token_id: int = 0, eos_token_id: int = 1) -> Any:
    """A freshly initialised ``Qwen3ForCausalLM`` (float32) with ``cfg``'s sizes; ``seed`` fixes init."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(cfg, pad_token_id=pad_token_id, eos_token_id=eos_token_id))
    return model.float()


def n_params(model: torch.nn.Module) -> int:
    """Distinct parameters (tied tables counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


#: One model load at a time in a process. ``from_pretrained`` builds the model under process-wide
#: patches (empty-weight init, tie-weights state), so a second thread loading at the same moment —
#: the pipelined flow's rollout side and its update side, both resuming — can get parameters left
#: on the meta device ("Cannot copy out of meta tensor"), seen in a chaos run; four threads loading
#: the shipped checkpoint at once reproduce it every time without the lock.
_LOAD_LOCK = threading.Lock()


def load_policy(src: str | Path | ModelConfig | None = None, *, dtype: str | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local directory; never touches a hub.

    ``src``: a directory, a ``ModelConfig`` (its ``path``; None = the shipped tiny-warm
    checkpoint), or None (the shipped checkpoint). Weights are cast to ``dtype`` (default
    the config's, i.e. float32: a bf16-saved checkpoint is upcast for training).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = src if isinstance(src, ModelConfig) else ModelConfig(path=None if src is None else str(src))
    path = Path(cfg.path) if cfg.path else TINY_WARM_DIR
    if not (path / "config.json").is_file():
        check_not_retired(path)  # removed by run.keep_checkpoints: say so
        hint = " (run `trace-rl warmup` to build the tiny checkpoint)" if cfg.path is None else ""
        raise FileNotFoundError(f"no model at {path}: config.json missing{hint}")
    check_model_dir(path)  # safetensors and JSON only: a pickled weights file is refused
    torch_dtype = getattr(torch, dtype or cfg.dtype)
    with _LOAD_LOCK:  # from_pretrained is not thread-safe: see _LOAD_LOCK
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True,
                                                     use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token_id is None:  # real Qwen3 tokenizers have one; be safe for other models
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(torch_dtype), tokenizer
