"""The pipeline's off-policy correction (decoupled PPO with a truncated behaviour weight) against
a case computed by hand, and its statistics through the real update on the tiny policy."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.tinypolicy import one_thread, tiny_model, tiny_tokenizer  # noqa: F401
from trace_core.policy.config import UpdateConfig
from trace_core.policy.update import (
    TrainSequence,
    behaviour_weights,
    make_optimizer,
    surrogate_loss,
    token_logprobs,
    update_policy,
    with_proximal,
)


def _log(*p: float) -> torch.Tensor:
    return torch.tensor([[0.0, *(math.log(x) for x in p)]])


def test_decoupled_truncated_loss_matches_hand_computation():
    """Two loss tokens (position 0 is the prompt, masked). ε = 0.2, C = 2.

    token 1: behaviour 0.5, proximal 0.6, current 0.66, A = +1
             w = 0.6 / 0.5 = 1.2 (kept); ratio = 0.66 / 0.6 = 1.1 (inside [0.8, 1.2])
             loss = -1.2 · min(1.1·1, 1.1·1) = -1.32
    token 2: behaviour 0.2, proximal 0.6, current 0.3, A = -1
             w = 0.6 / 0.2 = 3 -> truncated to 2; ratio = 0.5 -> clipped to 0.8
             loss = -2 · min(0.5·(-1), 0.8·(-1)) = -2 · (-0.8) = 1.6
    sum = 0.28; untruncated weights 1.2 and 3: mean 2.1, max 3, truncated share 1/2; clipped 1 token.
    """
    cfg = UpdateConfig(clip_eps=0.2, is_cap=2.0)
    logp = _log(0.66, 0.3).requires_grad_(True)
    batch = {"loss_mask": torch.tensor([[0.0, 1.0, 1.0]]), "advantages": torch.tensor([[0.0, 1.0, -1.0]]),
             "old_logprobs": _log(0.5, 0.2), "prox_logprobs": _log(0.6, 0.6)}
    loss, stats = surrogate_loss(logp, batch, cfg)
    assert loss.item() == pytest.approx(0.28, abs=1e-5)
    assert stats["is_weight"].item() == pytest.approx(4.2, abs=1e-5)  # summed over the 2 loss tokens
    assert stats["is_weight_max"].item() == pytest.approx(3.0, abs=1e-5)
    assert stats["is_truncated"].item() == 1.0
    assert stats["clip_frac"].item() == 1.0
    loss.backward()
    # d/dlogp: token 1 unclipped: -w·ratio·A = -1.32; token 2 on the clipped branch: 0
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -1.32, 0.0], abs=1e-5)


def test_without_proximal_log_probs_the_loss_is_the_plain_surrogate():
    """The synchronous flow (no ``prox_logprobs``): ratio against the behaviour log-probs, no weight."""
    cfg = UpdateConfig(clip_eps=0.2)
    logp = _log(0.55)
    batch = {"loss_mask": torch.tensor([[0.0, 1.0]]), "advantages": torch.tensor([[0.0, 1.0]]),
             "old_logprobs": _log(0.5)}
    loss, stats = surrogate_loss(logp, batch, cfg)
    assert loss.item() == pytest.approx(-1.1, abs=1e-5)
    assert "is_weight" not in stats


def test_behaviour_weights_ignore_masked_tokens():
    w, stats = behaviour_weights(_log(0.9, 0.1), _log(0.1, 0.1), torch.tensor([[0.0, 0.0, 1.0]]), cap=5.0)
    assert w.tolist()[0] == pytest.approx([1.0, 1.0, 1.0])  # off the mask: 1, whatever the log-probs
    assert stats["is_weight_max"].item() == pytest.approx(1.0) and stats["is_truncated"].item() == 0.0


def test_update_reports_importance_ratio_statistics():
    """The real update with ``correct=True``: behaviour log-probs shifted by log 1.5 from the
    proximal policy's give weights of 1/1.5 on every loss token (mean = max = 0.667, none truncated);
    with behaviour = proximal the weights are 1."""
    model, tok = tiny_model(), tiny_tokenizer()
    cfg = UpdateConfig(minibatch_size=4, micro_batch_size=2, is_cap=2.0)
    ids = [[5, 6, 7, 8, 9, 10], [5, 6, 11, 12, 13]]
    seqs = [TrainSequence(x, [0, 0] + [1] * (len(x) - 2), [0.0, 0.0] + [1.0] * (len(x) - 2), [0.0] * len(x))
            for x in ids]
    prox = with_proximal(seqs, lambda b: token_logprobs(model, b), cfg, tok.pad_token_id, torch.device("cpu"))
    shifted = [dataclasses.replace(s, old_logprobs=[v + math.log(1.5) for v in s.prox_logprobs], prox_logprobs=None)
               for s in prox]
    opt, sched = make_optimizer(model, cfg)
    stats = update_policy(model, opt, sched, shifted, cfg, pad_id=tok.pad_token_id, correct=True)
    assert stats.is_weight == pytest.approx(1 / 1.5, abs=1e-3)
    assert stats.is_weight_max == pytest.approx(1 / 1.5, abs=1e-3)
    assert stats.is_truncated == 0.0
    plain = update_policy(model, *make_optimizer(model, cfg), shifted, cfg, pad_id=tok.pad_token_id)
    assert plain.is_weight is None  # no correction asked: no statistics
