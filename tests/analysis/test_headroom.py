"""Headroom replay: each root rule with predicted and with true v, scored under the true v."""

from __future__ import annotations

import numpy as np

from trace_core.analysis.headroom import ROOT_RULES, replay_roots
from trace_core.config import TrainConfig


def test_perfect_prediction_loses_nothing_and_trace_beats_uniform():
    rng = np.random.default_rng(0)
    v_true = rng.beta(0.5, 0.5, 96)
    cfg = TrainConfig.model_validate({"allocation": {"budget_total": 192}})
    rows = {r["rule"]: r for r in replay_roots(v_true, v_true, cfg, seed=1)}
    assert set(rows) == set(ROOT_RULES)
    assert all(abs(r["lost_to_prediction"]) < 1e-12 for r in rows.values())
    assert rows["trace/trajectories"]["oracle"] > rows["grpo"]["oracle"]
    assert rows["trace/trajectories"]["oracle"] >= rows["pcl"]["oracle"] - 1e-9  # exact optimum of the same objective


def test_noisy_prediction_loses_effective_ratio():
    rng = np.random.default_rng(1)
    v_true = rng.beta(0.5, 0.5, 96)
    noisy = np.clip(v_true + rng.normal(0, 0.4, 96), 0, 1)
    cfg = TrainConfig.model_validate({"allocation": {"budget_total": 192}})
    rows = {r["rule"]: r for r in replay_roots(v_true, noisy, cfg, seed=1)}
    assert rows["trace/trajectories"]["lost_to_prediction"] > 0
    assert rows["grpo"]["lost_to_prediction"] == 0  # uniform ignores v
