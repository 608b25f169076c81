"""The clipped-surrogate update moves the policy the way the advantages say."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tinypolicy import one_thread, prompts, spread_model, tiny_chat  # noqa: F401
from trace_core.engines.base import GenRequest
from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine
from trace_core.policy.update import (
    TrainSequence,
    UpdateConfig,
    collate,
    make_optimizer,
    surrogate_loss,
    token_logprobs,
    update_policy,
)


@pytest.fixture(scope="module")
def chat():
    return tiny_chat()


def sampled_batch(model, chat, adv_sign):
    """Sequences of sampled actions (old log-probs from the engine) with advantage ±1."""
    out = []
    for k, p in enumerate(prompts(chat)):
        res = HFEngine(model, chat).generate([GenRequest(p, n=4, seed=k)], SamplingConfig(max_new_tokens=8, seed=3))
        for j, r in enumerate(res[0]):
            a = adv_sign(k, j)
            ids = list(p) + list(r.token_ids)
            out.append(TrainSequence(ids, [0] * len(p) + [1] * len(r.token_ids), [0.0] * len(p) + [a] * len(r.token_ids),
                                     [0.0] * len(p) + list(r.logprobs)))
    return out


def mean_lp(model, seqs, chat, sign):
    sel = [s for s in seqs if s.advantages[-1] * sign > 0]
    b = collate(sel, chat.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        lp = token_logprobs(model, b)
    return float((lp * b["loss_mask"]).sum() / b["loss_mask"].sum())


def test_update_raises_positive_and_lowers_negative_actions(chat):
    model = spread_model(seed=3)
    seqs = sampled_batch(model, chat, lambda k, j: 1.0 if j % 2 == 0 else -1.0)
    pos0, neg0 = mean_lp(model, seqs, chat, +1), mean_lp(model, seqs, chat, -1)
    cfg = UpdateConfig(lr=3e-3, minibatch_size=64, micro_batch_size=4)
    opt, sched = make_optimizer(model, cfg)
    m = update_policy(model, opt, sched, seqs, cfg, pad_id=chat.pad_token_id, seed=0)
    assert m.steps == 1 and m.sequences == len(seqs)
    assert abs(m.approx_kl_old) < 1e-4  # on-policy: the engine's log-probs are the model's
    assert mean_lp(model, seqs, chat, +1) > pos0 + 1e-3
    assert mean_lp(model, seqs, chat, -1) < neg0 - 1e-3


def test_gradient_accumulation_matches_one_big_batch(chat):
    seqs = sampled_batch(spread_model(seed=3), chat, lambda k, j: float(j) - 1.5)
    grads = []
    for micro in (12, 3):
        model = spread_model(seed=3)
        cfg = UpdateConfig(micro_batch_size=micro, minibatch_size=12, max_grad_norm=1e6)
        opt, sched = make_optimizer(model, cfg)
        opt.zero_grad = lambda set_to_none=True: None  # keep the accumulated gradients to compare
        update_policy(model, opt, sched, seqs, cfg, pad_id=chat.pad_token_id, seed=0)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-3)


def test_surrogate_masks_clips_and_kl():
    cfg = UpdateConfig(clip_eps=0.2, kl_coef=0.5)
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]])).requires_grad_()
    batch = {"loss_mask": torch.tensor([[0.0, 1.0, 1.0, 0.0]]), "advantages": torch.tensor([[9.0, 1.0, -2.0, 9.0]]),
             "old_logprobs": torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))}
    loss, stats = surrogate_loss(logp, batch, cfg, ref_logp=logp.detach())
    assert float(loss.detach()) == pytest.approx(1.0)  # ratio 1: −Σ A over loss tokens only; KL to itself 0
    assert float(stats["kl"]) == pytest.approx(0.0)
    assert float(stats["entropy"]) == pytest.approx(2 * np.log(2))  # Σ -log π over the 2 loss tokens
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.0, 2.0, 0.0])
    # ratio 2 with A > 0 is clipped at 1.2: no gradient
    logp2 = torch.log(torch.tensor([[1.0, 1.0, 1.0, 1.0]])).requires_grad_()
    batch["advantages"] = torch.ones(1, 4)
    loss2, stats2 = surrogate_loss(logp2, batch, UpdateConfig())
    loss2.backward()
    assert float(loss2.detach()) == pytest.approx(-2.4) and float(stats2["clip_frac"]) == 2.0
    assert logp2.grad.abs().sum() == 0


def _weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_kl_pulls_the_policy_toward_the_reference(chat):
    """Same batch, same steps: with β > 0 the policy ends nearer the reference (its start) than with
    β = 0; the k3 term is reported, >= 0, and 0 at the first step where policy == reference."""
    ref = spread_model(seed=3).requires_grad_(False)
    seqs = sampled_batch(ref, chat, lambda k, j: 1.0 if j % 2 == 0 else -1.0)
    probe = collate(seqs, chat.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        ref_lp = token_logprobs(ref, probe)
    gap, kl = {}, {}
    for beta in (0.0, 1.0):
        model = spread_model(seed=3)
        cfg = UpdateConfig(lr=3e-3, minibatch_size=12, micro_batch_size=6, ppo_epochs=4, kl_coef=beta)
        opt, sched = make_optimizer(model, cfg)
        m = update_policy(model, opt, sched, seqs, cfg, pad_id=chat.pad_token_id, seed=0, ref_model=ref)
        with torch.no_grad():
            d = (ref_lp - token_logprobs(model, probe)) * probe["loss_mask"]
        kl[beta] = float(((torch.exp(d) - d - 1) * probe["loss_mask"]).sum() / probe["loss_mask"].sum())
        gap[beta] = float((_weights(model) - _weights(ref)).norm())
        assert (m.kl is not None) == (beta > 0)
        if beta:
            assert m.kl >= 0.0
    assert kl[1.0] < 0.8 * kl[0.0] and gap[1.0] < gap[0.0]
    # first step: policy == reference, so the k3 term and its gradient are exactly 0
    model = spread_model(seed=3)
    b = collate(seqs[:4], chat.pad_token_id, torch.device("cpu"))
    logp = token_logprobs(model, b)
    _, stats = surrogate_loss(logp, b, UpdateConfig(kl_coef=1.0), ref_logp=token_logprobs(ref, b).detach())
    assert float(stats["kl"]) == 0.0


def test_k3_is_nonnegative():
    gen = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(4, 50, generator=gen) * 3, torch.randn(4, 50, generator=gen) * 3
    batch = {"loss_mask": torch.ones(4, 50), "advantages": torch.zeros(4, 50), "old_logprobs": logp}
    _, stats = surrogate_loss(logp, batch, UpdateConfig(kl_coef=0.1), ref_logp=ref)
    d = ref - logp
    assert float(stats["kl"]) > 0 and bool(((torch.exp(d) - d - 1) >= 0).all())


def test_kl_coef_zero_ignores_the_reference(chat):
    """β = 0: a reference passed in is never run and the step is bit-identical to no reference."""
    seqs = sampled_batch(spread_model(seed=3), chat, lambda k, j: float(j) - 1.5)
    out = []
    for ref in (None, spread_model(seed=5)):
        model = spread_model(seed=3)
        cfg = UpdateConfig(minibatch_size=6, micro_batch_size=3)
        opt, sched = make_optimizer(model, cfg)
        m = update_policy(model, opt, sched, seqs, cfg, pad_id=chat.pad_token_id, seed=0, ref_model=ref)
        out.append((_weights(model), m.model_dump(exclude={"seconds", "samples_per_s"})))
    assert torch.equal(out[0][0], out[1][0]) and out[0][1] == out[1][1] and out[0][1]["kl"] is None


def _grads_after(seqs, chat, cfg):
    model = spread_model(seed=3)
    opt, sched = make_optimizer(model, cfg)
    opt.zero_grad = lambda set_to_none=True: None  # keep the gradients to compare
    m = update_policy(model, opt, sched, seqs, cfg, pad_id=chat.pad_token_id, seed=0)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), m, model


def test_chunked_logprobs_match_the_full_softmax(chat):
    model = spread_model(seed=3)
    seqs = sampled_batch(model, chat, lambda k, j: 1.0)
    b = collate(seqs, chat.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        full = token_logprobs(model, b)
        for chunk in (1, 7, 64, 10_000):
            assert (token_logprobs(model, b, chunk=chunk) - full).abs().max() <= 1e-6, chunk
    cfg = UpdateConfig(minibatch_size=12, micro_batch_size=4, max_grad_norm=1e6)
    g0, m0, _ = _grads_after(seqs, chat, cfg)
    g1, m1, _ = _grads_after(seqs, chat, cfg.model_copy(update={"logprob_chunk": 5}))
    assert (g1 - g0).abs().max() <= 1e-6 * max(1.0, float(g0.abs().max()))
    assert m1.loss == pytest.approx(m0.loss, rel=1e-6, abs=1e-7)


def test_gradient_checkpointing_gives_the_same_gradients(chat):
    seqs = sampled_batch(spread_model(seed=3), chat, lambda k, j: float(j) - 1.5)
    cfg = UpdateConfig(minibatch_size=12, micro_batch_size=4, max_grad_norm=1e6)
    g0, m0, _ = _grads_after(seqs, chat, cfg)
    g1, m1, model = _grads_after(seqs, chat, cfg.model_copy(update={"gradient_checkpointing": True}))
    assert torch.equal(g0, g1) and m0.loss == m1.loss
    # on for the update only (the live model also samples)
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
