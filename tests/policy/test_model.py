"""Tiny Qwen3: builds from the config, forward works, save/load round trip by local path."""

from __future__ import annotations

import pytest
import torch

from trace_core.policy.chat import ChatFormat
from trace_core.policy.model import TINY_WARM_DIR, ModelConfig, build_model, load_policy, n_params
from trace_core.policy.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer


def test_default_sizes_match_prototype():
    model = build_model(ModelConfig())
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert 3.3e6 < n_params(model) < 3.5e6  # the prototype's 3.4M
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_forward_save_load(tmp_path):
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64, vocab_size=320)
    tok = train_tokenizer(["hello world <answer>42</answer>"] * 10, TokenizerConfig(vocab_size=320))
    model = build_model(cfg, seed=1)
    ids = torch.tensor([ChatFormat(tok).encode("hello world <answer>42</answer>")])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 320) and torch.isfinite(logits).all()
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    save_tokenizer(tok, tmp_path)
    loaded, tok2 = load_policy(tmp_path)
    assert next(loaded.parameters()).dtype == torch.float32  # bf16 on disk, fp32 for training
    assert tok2.encode("hello world", add_special_tokens=False) == tok.encode("hello world", add_special_tokens=False)
    assert torch.allclose(loaded(ids).logits, model.float()(ids).logits, atol=1e-4)


def test_bad_configs():
    with pytest.raises(ValueError, match="multiple"):
        build_model(ModelConfig(num_heads=3, num_kv_heads=2))
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy("/nonexistent/dir")


@pytest.mark.skipif(not (TINY_WARM_DIR / "model.safetensors").is_file(),
                    reason="shipped checkpoint trace_core/assets/tiny-warm/ not built yet")
def test_shipped_checkpoint_loads_and_is_small():
    model, tok = load_policy()  # default: the shipped tiny-warm checkpoint
    assert type(model).__name__ == "Qwen3ForCausalLM" and next(model.parameters()).dtype == torch.float32
    assert len(tok) <= model.config.vocab_size
    chat = ChatFormat(tok)
    assert chat.stop_strings == () and len(chat.stop_token_ids) == 4
    assert (TINY_WARM_DIR / "model.safetensors").stat().st_size < 16e6


def test_models_loaded_by_threads_at_once_hold_real_weights():
    """The pipelined flow's two sides may load a checkpoint at the same moment (both resume at
    once): every model gets its weights, none is left on the meta device."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        models = [m for m, _ in pool.map(lambda _: load_policy(), range(4))]
    reference = dict(models[0].named_parameters())
    for model in models:
        for name, p in model.named_parameters():
            assert not p.is_meta, name
            assert torch.equal(p, reference[name]), name
