"""Warm-up SFT: schedule, batching, a short real run lowers the loss, the shipped checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trace_core.policy.model import TINY_WARM_DIR, ModelConfig, load_policy
from trace_core.policy.warmup import WarmupConfig, bucketed_batches, collate, lr_at, run_warmup

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = WarmupConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_collate_labels_only_on_assistant_tokens():
    batch = collate([([5, 6, 7, 8], [0, 1, 1, 0]), ([9, 10], [0, 1])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100], [-100, 10, -100, -100]]


def test_bucketing_cuts_padding():
    rng = np.random.default_rng(0)
    eps = [([1] * int(n), [1] * int(n)) for n in rng.integers(20, 300, size=512)]

    def waste(bucket: int) -> float:
        batches = list(bucketed_batches(iter(eps), 16, bucket, seed=0))
        real = sum(len(e[0]) for b in batches for e in b)
        return 1 - real / sum(16 * max(len(e[0]) for e in b) for b in batches)

    assert waste(32) < 0.05 < 0.3 < waste(1)


@pytest.mark.slow
def test_short_warmup_lowers_loss(tmp_path):
    cfg = WarmupConfig(steps=30, batch_size=4, warmup_steps=3, lr=3e-3, log_every=10, tokenizer_demos=150,
                       bucket_batches=4)
    recipe = run_warmup(cfg, tmp_path, model_cfg=TINY, progress=False)
    curve = [loss for _, loss in recipe["loss_curve"]]
    assert curve[-1] < curve[0] - 0.5, curve
    assert recipe["tokens_per_s"] > 0 and (tmp_path / "model.safetensors").is_file()
    model, tok = load_policy(tmp_path)
    assert next(model.parameters()).dtype == torch.float32 and len(tok) <= model.config.vocab_size
    saved = json.loads((tmp_path / "recipe.json").read_text())
    assert saved["config_hash"] == recipe["config_hash"] and saved["steps_done"] == 30
    # continuing from the checkpoint keeps its tokenizer and starts from its loss, not from scratch
    more = cfg.model_copy(update={"steps": 5, "warmup_steps": 1, "log_every": 5, "init_from": str(tmp_path)})
    cont = run_warmup(more, tmp_path / "cont", progress=False)
    assert cont["loss_curve"][-1][1] < curve[0] - 0.5
    assert cont["stages"][0]["config_hash"] == recipe["config_hash"]


SHIPPED = (TINY_WARM_DIR / "recipe.json").is_file() and "success" in json.loads(
    (TINY_WARM_DIR / "recipe.json").read_text() if (TINY_WARM_DIR / "recipe.json").is_file() else "{}")


@pytest.mark.slow
@pytest.mark.skipif(not SHIPPED, reason="shipped checkpoint trace_core/assets/tiny-warm/ with a recorded success "
                    "table not built yet (python -m trace_core.policy.warmup configs/tiny.yaml ...)")
def test_shipped_checkpoint_reproduces_success_spread():
    from trace_core.policy.evaluate import heldout_tasks, policy_rewards, success_table

    recorded = json.loads((TINY_WARM_DIR / "recipe.json").read_text())["success"]
    model, tok = load_policy()
    assert 0.0 < recorded["overall"] < 1.0 and recorded["mixed_share"] > 0.05
    # a small fresh sample: 3 families x 2 levels (easiest, hardest) x 6 tasks x 4 samples
    tasks = heldout_tasks(["math", "qa", "fc"], [0, 3], 6, seed=0)
    torch.set_num_threads(1)
    rewards = policy_rewards(model, tok, tasks, 4, seed=1, max_new_tokens=recorded["measured"]["max_new_tokens"])
    assert rewards.shape == (len(tasks), 4)
    got = success_table(tasks, rewards)
    want = np.mean([recorded["cells"][k]["success"] for k in got["cells"]])
    se = np.sqrt(max(want * (1 - want), 0.05) / rewards.size)
    assert abs(got["overall"] - want) < 4 * se + 0.05, (got["overall"], want)
    easy = np.mean([got["cells"][f"{f}/0"]["success"] for f in ("math", "qa", "fc")])
    hard = np.mean([got["cells"][f"{f}/3"]["success"] for f in ("math", "qa", "fc")])
    assert easy > hard  # the difficulty gradient is still there
