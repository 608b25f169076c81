"""Checkpoints hold everything needed to continue a run bit for bit (CPU)."""

from __future__ import annotations

import numpy as np
import torch

from tests.tinypolicy import one_thread, prompts, spread_model, tiny_chat, tiny_tokenizer  # noqa: F401
from trace_core.policy.checkpoint import load_checkpoint, save_checkpoint
from trace_core.policy.update import TrainSequence, UpdateConfig, make_optimizer, update_policy


def _batch(chat, rng: np.random.Generator):
    out = []
    for p in prompts(chat):
        acts = rng.integers(10, 300, size=6).tolist()
        out.append(TrainSequence(list(p) + acts, [0] * len(p) + [1] * 6, [0.0] * len(p) + [float(rng.normal())] * 6,
                                 [0.0] * len(p) + [-5.0] * 6))
    return out


def _steps(model, opt, sched, chat, rng, n):
    cfg = UpdateConfig(lr=1e-3, warmup_steps=3, micro_batch_size=2)
    for _ in range(n):
        # the torch RNG draw stands in for any sampling the loop does between updates
        seed = int(torch.randint(0, 2**31, (1,)))
        update_policy(model, opt, sched, _batch(chat, rng), cfg, pad_id=chat.pad_token_id, seed=seed)


def test_resume_continues_bit_for_bit(tmp_path):
    chat = tiny_chat()
    cfg = UpdateConfig(lr=1e-3, warmup_steps=3)
    torch.manual_seed(0)
    model = spread_model(seed=5)
    opt, sched = make_optimizer(model, cfg)
    rng = np.random.default_rng(11)
    _steps(model, opt, sched, chat, rng, 2)
    save_checkpoint(tmp_path / "ck", model, optimizer=opt, scheduler=sched, rng=rng, tokenizer=tiny_tokenizer(),
                    cursor={"iteration": 2, "offset": 6})
    _steps(model, opt, sched, chat, rng, 2)
    straight = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(123)  # clobber global state: the checkpoint must restore it
    model2 = spread_model(seed=99)
    opt2, sched2 = make_optimizer(model2, cfg)
    rng2 = np.random.default_rng(0)
    cursor = load_checkpoint(tmp_path / "ck", model2, optimizer=opt2, scheduler=sched2, rng=rng2)
    assert cursor == {"iteration": 2, "offset": 6}
    assert sched2.last_epoch == sched.last_epoch - 2
    _steps(model2, opt2, sched2, chat, rng2, 2)
    resumed = model2.state_dict()
    assert straight.keys() == resumed.keys()
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    assert (tmp_path / "ck" / "tokenizer.json").is_file() and not (tmp_path / "ck.tmp").exists()
