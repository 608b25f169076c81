"""The capacity plan's formulas, checked exactly where they can be (parameter counts, the tensors
autograd saves per token, KV bytes) and the ``trace-rl plan`` command on the shipped Qwen3 configs.
The comparison with measured peak RSS is scripts/update_memory.py (timing-free but slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flows.cli import app
from trace_core.analysis.capacity import KNOWN_QWEN3, Shape, update_memory
from trace_core.policy.config import ModelConfig
from trace_core.policy.model import build_model, n_params

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHAPES = [Shape(64, 2, 4, 2, 16, 192, 1000, False), Shape(96, 3, 6, 2, 32, 256, 512, True),
          Shape(128, 1, 8, 8, 16, 384, 2048, False)]


def _model(s: Shape):
    return build_model(ModelConfig(hidden_size=s.hidden, num_layers=s.layers, num_heads=s.heads,
                                   num_kv_heads=s.kv_heads, head_dim=s.head_dim, intermediate_size=s.intermediate,
                                   vocab_size=s.vocab, tie_embeddings=s.tied))


@pytest.mark.parametrize("shape", SHAPES)
def test_parameter_count_is_the_models(shape):
    assert shape.params == n_params(_model(shape))


def test_published_qwen3_sizes():
    assert round(KNOWN_QWEN3["qwen3-8b"].params / 1e9, 2) == 8.19  # Qwen3-8B: 8.2B
    assert round(KNOWN_QWEN3["qwen3-14b"].params / 1e9, 1) == 14.8  # Qwen3-14B: 14.8B
    assert round(KNOWN_QWEN3["qwen3-0.6b"].params / 1e9, 2) == 0.60  # tied
    assert KNOWN_QWEN3["qwen3-8b"].kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2  # 144 KiB


def _saved_floats(model, ids) -> float:
    """Floats in the tensors autograd saves for backward (parameters excluded) during one forward."""
    from trace_core.policy.update import token_logprobs

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 1.0, 0)
    return sum(v for k, v in seen.items() if k not in params) / 4


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ckpt", [False, True])
def test_activation_floats_per_block_are_what_autograd_saves(shape, ckpt):
    from trace_core.policy.update import set_checkpointing

    torch.manual_seed(0)
    ids = torch.randint(0, shape.vocab, (2, 64))
    counts = []
    for layers in (1, 2):  # the difference is one block
        model = _model(Shape(**{**shape.__dict__, "layers": layers}))
        set_checkpointing(model, ckpt)
        model.train()
        counts.append(_saved_floats(model, ids))
    per_token = (counts[1] - counts[0]) / ids.numel()
    want = shape.hidden if ckpt else shape.block_floats_per_token()
    assert per_token == pytest.approx(want, rel=0.02)


def test_update_terms_follow_the_strategy():
    s = KNOWN_QWEN3["qwen3-8b"]
    kw = {"tokens": 4096, "micro_batch": 2, "checkpointing": True, "chunk": 1024}
    single = update_memory(s, world_size=1, strategy="single", **kw).terms
    fsdp = update_memory(s, world_size=8, strategy="fsdp", **kw).terms
    ddp = update_memory(s, world_size=8, strategy="ddp", **kw).terms
    assert single["AdamW moments"] == 8 * s.params and fsdp["AdamW moments"] == s.params
    assert ddp["DDP gradient buckets"] == 4 * s.params and "FSDP unsharded working set" in fsdp
    assert fsdp["log-prob peak"] == 3 * 4 * 2 * 1024 * s.vocab  # micro x chunk positions, float32
    unchunked = update_memory(s, world_size=8, strategy="fsdp", **{**kw, "chunk": 0}).terms
    assert unchunked["log-prob peak"] == 3 * 4 * 4096 * s.vocab


def test_plan_of_the_shipped_qwen3_configs():
    for name, params in (("qwen3-8b", "8.19B"), ("qwen3-14b", "14.77B")):
        res = CliRunner().invoke(app, ["plan", "--config", str(CONFIGS / f"{name}.yaml")])
        assert res.exit_code == 0, res.output
        assert f"model: {params} parameters" in res.output
        assert "published config.json" in res.output and "assumptions:" in res.output
        assert "KV cache" in res.output and res.output.rstrip().endswith("of 80 GiB)")
        assert "fits: yes" in res.output
    small = CliRunner().invoke(app, ["plan", "--config", str(CONFIGS / "qwen3-14b.yaml"), "--gpu-gib", "40"])
    assert small.exit_code == 1 and "fits: no" in small.output and "DOES NOT FIT" in small.output


def test_plan_reads_a_model_directory_and_refuses_an_unknown_one(tmp_path):
    res = CliRunner().invoke(app, ["plan", "--config", str(CONFIGS / "tiny.yaml")])
    assert res.exit_code == 0 and "tiny-warm/config.json" in res.output  # the shipped checkpoint the run loads
    bad = CliRunner().invoke(app, ["plan", "--config", str(CONFIGS / "qwen3-8b.yaml"),
                                   "--set", f"model.path={tmp_path / 'Llama-9B'}"])
    assert bad.exit_code == 2 and "is not a known Qwen3 size" in bad.output and "Traceback" not in bad.output
