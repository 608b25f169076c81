"""The history shift's slope and its application (``stages.history_shift``); the features on real
rollouts of the shipped policy are tested in test_iteration.py."""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.predictor.config import HistoryShiftConfig
from trace_core.stages.history_shift import _logit, fit_slope, shifted


def _rows(beta: float, n_rows: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.1, 0.9, n_rows)
    d = rng.uniform(-2, 2, n_rows)
    p = 1 / (1 + np.exp(-(_logit(v) + beta * d)))
    n = np.full(n_rows, 4)
    return pl.DataFrame({"is_shift": d, "v_unshifted": v, "n_success": rng.binomial(n, p), "n_total": n})


def test_the_slope_recovers_how_the_shift_moves_outcomes():
    cfg = HistoryShiftConfig(l2=1.0)
    for true in (0.0, 0.5, 1.0):
        beta, used = fit_slope(_rows(true, 4000, seed=int(true * 10)), cfg)
        assert used == 4000
        assert abs(beta - true) < 0.1, (true, beta)


def test_the_slope_waits_for_enough_rows_and_ignores_rows_without_a_shift():
    cfg = HistoryShiftConfig(min_rows=30)
    rows = _rows(1.0, 29)
    assert fit_slope(rows, cfg) == (0.0, 29)
    zeros = rows.with_columns(pl.lit(0.0).alias("is_shift"))
    nulls = rows.with_columns(pl.lit(None, dtype=pl.Float64).alias("is_shift"))
    assert fit_slope(pl.concat([rows, zeros, nulls]), cfg) == (0.0, 29), "d = 0 or null rows carry no slope"
    beta, used = fit_slope(_rows(1.0, 200), cfg)
    assert used == 200 and 0.3 < beta < 1.5
    strong = fit_slope(_rows(1.0, 200), HistoryShiftConfig(l2=1e6))[0]
    assert abs(strong) < 0.01, "a large L2 keeps the slope at 0 (no shift)"


def test_shifted_moves_only_rows_with_a_feature_in_its_direction():
    v = np.array([0.3, 0.3, 0.3, 0.3])
    d = np.array([np.nan, 0.0, 1.0, -1.0])
    out = shifted(v, d, 0.5)
    assert out[0] == 0.3 and out[1] == 0.3
    assert out[2] > 0.3 > out[3]
    assert np.isclose(_logit(out[2:3])[0] - _logit(v[2:3])[0], 0.5)
    assert np.array_equal(shifted(v, d, 0.0), v)


def test_the_history_shift_needs_the_synchronous_flow():
    from pathlib import Path

    import pytest

    from trace_core.config import load_train_config
    from trace_core.config.io import ConfigError

    configs = Path(__file__).resolve().parents[2] / "configs"
    with pytest.raises(ConfigError, match="max_staleness"):
        load_train_config(configs / "small-ci.yaml", ["predictor.history_shift.enabled=true", "run.max_staleness=1"])
