"""The oracle bound (``predictor.oracle_samples``): the planner's values are success rates sampled
under the current policy, the sampled episodes stay out of the budget and the node table, and
their tokens are reported apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from trace_core.config import load_train_config
from trace_core.policy.model import TINY_WARM_DIR
from trace_core.runtime import Runtime
from trace_core.stages import iteration as it
from trace_core.stages.run import RunRef, initial_checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                 reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


def test_oracle_values_are_sampled_rates_outside_the_budget(tmp_path):
    n = 4
    cfg = load_train_config(CONFIGS / "small-ci.yaml", [
        "run.eval_tasks=0", "run.candidate_pool=8", "allocation.budget_total=16", f"predictor.oracle_samples={n}",
        "sampling.max_new_tokens=16", "env.max_turns=2", "run.threads=1"])
    ref, ckpt = RunRef(str(tmp_path / "home"), "oracle"), initial_checkpoint(cfg)
    with Runtime(cfg) as rt:
        pred = it.refresh_predictor(ref, cfg, 0)
        with pytest.raises(ValueError, match="predictor.oracle_samples"):
            it.allocate_roots(ref, cfg, 0, pred)  # the oracle needs the policy it samples under
        roots = it.allocate_roots(ref, cfg, 0, pred, ckpt, rt)
        prompts = pl.read_parquet(roots.prompts)
        eps = cfg.allocation.min_prob
        rates = np.clip(np.arange(n + 1) / n, eps, 1 - eps)
        assert all(np.isclose(rates, v).any() for v in prompts["v_pred"].to_list())  # k / n successes
        assert roots.oracle_tokens > 0
        raw = it.generate_raw_rollouts(ref, cfg, 0, ckpt, roots, rt)
        assert raw.trajectories == int(prompts["m_alloc"].sum())  # the oracle's episodes are not in it
        prefixes = it.score_prefixes(ref, cfg, 0, pred, roots, raw, ckpt, rt)
        alloc = pl.read_parquet(prefixes.path)
        if alloc.height:
            assert prefixes.oracle_tokens > 0
            assert all(np.isclose(rates, v).any() for v in alloc["flip"].to_list())
        assert prefixes.ext_used <= prefixes.ext_budget


def test_a_roots_only_oracle_leaves_the_prefixes_predicted(tmp_path):
    cfg = load_train_config(CONFIGS / "small-ci.yaml", [
        "run.eval_tasks=0", "run.candidate_pool=8", "allocation.budget_total=16", "predictor.oracle_samples=2",
        "predictor.oracle_stages=roots", "sampling.max_new_tokens=16", "env.max_turns=2", "run.threads=1"])
    ref, ckpt = RunRef(str(tmp_path / "home"), "oracle-roots"), initial_checkpoint(cfg)
    with Runtime(cfg) as rt:
        pred = it.refresh_predictor(ref, cfg, 0)
        roots = it.allocate_roots(ref, cfg, 0, pred, ckpt, rt)
        assert roots.oracle_tokens > 0
        raw = it.generate_raw_rollouts(ref, cfg, 0, ckpt, roots, rt)
        prefixes = it.score_prefixes(ref, cfg, 0, pred, roots, raw, ckpt, rt)
        assert prefixes.oracle_tokens == 0  # predicted, not sampled


def test_the_oracle_told_only_its_zeros_keeps_the_other_predictions(tmp_path):
    """``oracle_knows: zeros``: a candidate whose oracle episodes all failed is planned at 0 (the
    clip), every other one at the predictor's value, and the sampling is still paid apart."""
    over = ["run.eval_tasks=0", "run.candidate_pool=8", "allocation.budget_total=16", "sampling.max_new_tokens=16",
            "env.max_turns=2", "run.threads=1"]
    cfg = load_train_config(CONFIGS / "small-ci.yaml", over)
    told = load_train_config(CONFIGS / "small-ci.yaml", [*over, "predictor.oracle_samples=2",
                                                         "predictor.oracle_stages=roots", "predictor.oracle_knows=zeros"])
    ref, ckpt = RunRef(str(tmp_path / "home"), "oracle-zeros"), initial_checkpoint(cfg)
    with Runtime(cfg) as rt:
        pred = it.refresh_predictor(ref, cfg, 0)
        plain = pl.read_parquet(it.allocate_roots(ref, cfg, 0, pred, ckpt, rt).prompts)["v_pred"].to_numpy()
        roots = it.allocate_roots(ref, told, 0, pred, ckpt, rt)
        v = pl.read_parquet(roots.prompts)["v_pred"].to_numpy()
    assert roots.oracle_tokens > 0
    eps = cfg.allocation.min_prob
    assert np.all(np.isclose(v, plain) | np.isclose(v, eps))


def test_oracle_blend_tells_the_planner_what_the_mode_names():
    from trace_core.stages.oracle import oracle_blend

    pred, sampled = np.array([0.3, 0.6, 0.9, 0.5]), np.array([0.0, 0.5, 1.0, 0.25])
    assert np.allclose(oracle_blend(pred, sampled, "rates"), sampled)
    assert np.allclose(oracle_blend(pred, sampled, "zeros"), [0.0, 0.6, 0.9, 0.5])
    assert np.allclose(oracle_blend(pred, sampled, "extremes"), [0.0, 0.6, 1.0, 0.5])
    with pytest.raises(ValueError, match="oracle_knows"):
        oracle_blend(pred, sampled, "most")
