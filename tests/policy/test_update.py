"""The clipped-surrogate update moves the policy the way the advantages say."""

from __future__ import annotations

import pytest
import torch

from tests.tinypolicy import one_thread, prompts, spread_model, tiny_chat  # noqa: F401
from trace_core.engines.base import GenRequest, SamplingConfig
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
    assert m["steps"] == 1 and m["sequences"] == len(seqs)
    assert abs(m["approx_kl_old"]) < 1e-4  # on-policy: the engine's log-probs are the model's
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
    assert float(stats["kl_ref"]) == pytest.approx(0.0)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.0, 2.0, 0.0])
    # ratio 2 with A > 0 is clipped at 1.2: no gradient
    logp2 = torch.log(torch.tensor([[1.0, 1.0, 1.0, 1.0]])).requires_grad_()
    batch["advantages"] = torch.ones(1, 4)
    loss2, stats2 = surrogate_loss(logp2, batch, UpdateConfig())
    loss2.backward()
    assert float(loss2.detach()) == pytest.approx(-2.4) and float(stats2["clip_frac"]) == 2.0
    assert logp2.grad.abs().sum() == 0
