"""A retried ``update_policy`` restarts from its input checkpoint: the live
policy is cached per process, so a failed attempt leaves its partly updated weights in memory;
the retry reloads the checkpoint's weights and gives the same result as a clean run. Stages
are called directly on the shipped tiny policy, as in ``test_iteration`` (no Prefect)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.iteration_stages import run_until_verified
from trace_core.config import load_train_config
from trace_core.policy.checkpoint import load_model_state
from trace_core.policy.model import TINY_WARM_DIR
from trace_core.runtime import Runtime
from trace_core.stages import iteration as it
from trace_core.stages.run import RunRef, initial_checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
pytestmark = [pytest.mark.slow,  # two updates of the tiny policy after stages 1-6 (~35 s)
              pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                 reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


def _corrupt(model) -> None:
    """What a failed attempt may leave behind: weights moved away from the checkpoint."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) * 0.05)


def test_update_retry_starts_from_the_input_checkpoint(tmp_path):
    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.eval_tasks=0", "allocation.budget_total=48", "run.threads=1"])
    ref = RunRef(str(tmp_path / "home"), "retry")
    ckpt = initial_checkpoint(cfg)
    rt = Runtime(cfg)  # a fresh process: the live policy is built from the checkpoint
    ver = run_until_verified(ref, cfg, ckpt, it.evaluate(cfg, ckpt, rt), rt)["verified"]

    clean = it.update_policy(ref, cfg, 0, ckpt, ver, rt)
    assert clean.stats.sequences > 0, "no trainable sequence: the update would not move the weights"
    clean_weights = load_model_state(clean.checkpoint)
    assert any(not torch.equal(clean_weights[k], v) for k, v in load_model_state(ckpt).items()
               if k in clean_weights)  # the update moved the weights

    # the attempt above stepped the cached model of `ckpt`; a crash mid-step leaves it elsewhere too
    pol = rt.policy(ckpt)
    _corrupt(pol.model)
    retried = it.update_policy(ref, cfg, 0, ckpt, ver, rt)

    timing = {"seconds", "samples_per_s"}
    assert retried.stats.model_dump(exclude=timing) == clean.stats.model_dump(exclude=timing)
    again = load_model_state(retried.checkpoint)
    assert again.keys() == clean_weights.keys()
    assert all(torch.equal(again[k], clean_weights[k]) for k in clean_weights)
    rt.close()
