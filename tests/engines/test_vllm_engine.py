"""vLLM engine: runs only where vLLM is installed (the GPU worker environment)."""

from __future__ import annotations

import importlib.util

import pytest

from trace_core.engines.vllm import VLLM_MISSING

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=VLLM_MISSING)


@pytest.mark.gpu
def test_vllm_greedy_matches_hf(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tests.tinypolicy import prompts, spread_model, tiny_chat, tiny_tokenizer
    from trace_core.engines.base import GenRequest, SamplingConfig, make_engine

    chat = tiny_chat()
    model = spread_model(seed=1)
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    reqs = [GenRequest(p, n=2) for p in prompts(chat)]
    hf = make_engine("hf", model=model, chat=chat).generate(reqs, greedy)
    eng = make_engine("vllm", model_path=tmp_path, chat=chat, max_model_len=512, llm_kwargs={"dtype": "float32"})
    out = eng.generate(reqs, greedy)
    assert [[r.token_ids for r in rs] for rs in out] == [[r.token_ids for r in rs] for rs in hf]
    eng.sleep()
    eng.wake()
    eng.load_weights(tmp_path)
    assert eng.generate(reqs, greedy)[0][0].token_ids == out[0][0].token_ids
