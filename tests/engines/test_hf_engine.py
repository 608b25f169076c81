"""The HF engine: shared-prefix sampling equals the plain path, seeds, stops, log-probs."""

from __future__ import annotations

import pytest
import torch

from tests.tinypolicy import one_thread, prompts, spread_model, tiny_chat  # noqa: F401
from trace_core.engines.base import GenRequest, engine_class, make_engine, register_engine
from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine, filter_logits
from trace_core.policy.update import TrainSequence, collate, token_logprobs


@pytest.fixture(scope="module")
def chat():
    return tiny_chat()


@pytest.fixture(scope="module")
def model():
    return spread_model(seed=1)


GREEDY = SamplingConfig(temperature=0, max_new_tokens=12)


def test_registry_is_lazy_and_strict():
    assert engine_class("hf") is HFEngine
    with pytest.raises(KeyError, match="known: hf, vllm"):
        engine_class("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf", "x.y:Z")


def test_greedy_shared_prefix_equals_plain_path_and_hf_generate(model, chat):
    ps = prompts(chat)
    reqs = [GenRequest(p, n=3) for p in ps]
    shared = HFEngine(model, chat, share_prefix=True).generate(reqs, GREEDY)
    plain = HFEngine(model, chat, share_prefix=False).generate(reqs, GREEDY)
    for p, s_res, p_res in zip(ps, shared, plain, strict=True):
        assert [r.token_ids for r in s_res] == [r.token_ids for r in p_res]
        assert len({r.token_ids for r in s_res}) == 1  # greedy: the n samples agree
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=12, top_k=None,
                             eos_token_id=sorted(chat.stop_token_ids), pad_token_id=chat.pad_token_id)
        assert list(s_res[0].token_ids) == ref[0, len(p):].tolist()
    assert len({r[0].token_ids for r in shared}) > 1  # the prompts lead to different outputs


def test_sampling_is_seeded_per_sample_and_batch_independent(model, chat):
    ps = prompts(chat)
    eng = make_engine("hf", model=model, chat=chat)
    s = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=5)
    alone = eng.generate([GenRequest(ps[1], n=4, seed=9)], s)[0]
    mixed = eng.generate([GenRequest(ps[0], n=2, seed=1), GenRequest(ps[1], n=4, seed=9)], s)[1]
    assert [r.token_ids for r in alone] == [r.token_ids for r in mixed]
    assert len({r.token_ids for r in alone}) == 4  # distinct samples of one prompt
    other = eng.generate([GenRequest(ps[1], n=4, seed=10)], s)[0]
    assert [r.token_ids for r in other] != [r.token_ids for r in alone]


def test_stop_and_length_finish_reasons(model, chat):
    eng = HFEngine(model, chat)
    res = eng.generate([GenRequest(p, n=8, seed=3) for p in prompts(chat)], SamplingConfig(max_new_tokens=6))
    for r in (r for rs in res for r in rs):
        assert len(r.token_ids) == len(r.logprobs) <= 6
        if r.finish_reason == "stop":
            assert r.token_ids[-1] in chat.stop_token_ids
        else:
            assert len(r.token_ids) == 6 and not set(r.token_ids) & chat.stop_token_ids
        assert r.text == chat.decode(r.token_ids)


def test_logprobs_match_a_full_forward(model, chat):
    """The engine's per-token log-probs equal the update's recomputation (ratio 1 on-policy)."""
    p = prompts(chat)[1]
    res = HFEngine(model, chat).generate([GenRequest(p, n=2, seed=4)], SamplingConfig(temperature=0.7, max_new_tokens=8))
    for r in res[0]:
        ids = list(p) + list(r.token_ids)
        seq = TrainSequence(ids, [0] * len(p) + [1] * len(r.token_ids), [0.0] * len(ids), [0.0] * len(ids))
        with torch.no_grad():
            lp = token_logprobs(model, collate([seq], chat.pad_token_id, torch.device("cpu")), temperature=0.7)
        assert torch.allclose(lp[0, len(p):], torch.tensor(r.logprobs), atol=1e-4)


def test_filter_logits_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.5)).tolist() == [[False, True, True, True]]
    assert not torch.isinf(filter_logits(logits, 0, 1.0)).any()


def test_load_weights_from_checkpoint(tmp_path, model, chat):
    from trace_core.policy.checkpoint import save_checkpoint

    other = spread_model(seed=7)
    save_checkpoint(tmp_path / "ck", other)
    eng = HFEngine(spread_model(seed=1), chat)
    p = prompts(chat)[0]
    before = eng.generate([GenRequest(p)], GREEDY)[0][0].token_ids
    eng.load_weights(tmp_path / "ck")
    after = eng.generate([GenRequest(p)], GREEDY)[0][0].token_ids
    assert after == HFEngine(other, chat).generate([GenRequest(p)], GREEDY)[0][0].token_ids
    assert after != before
