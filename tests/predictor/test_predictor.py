"""The default predictor end to end: shapes, first-iteration prior, NaN rejection, history,
calibration, registry, persistence."""

import numpy as np
import polars as pl
import pytest

from trace_core.predictor import (
    HistoryConfig,
    PredictorConfig,
    known_predictors,
    make_predictor,
    register_predictor,
)
from trace_core.predictor.calibration import fit_isotonic, fit_platt, logit, sigmoid
from trace_core.predictor.evaluation import ece
from trace_core.predictor.history import PromptHistory
from trace_core.tree import nodes_frame


def test_fit_predict_shapes_and_range(small_run, fast_config):
    pred = make_predictor(fast_config)
    train = small_run.filter(pl.col("iteration") < 2)
    report = pred.fit(train)
    assert not report.fallback and report.n_train > 0 and report.iterations == [0, 1]
    assert set(report.as_dict()) >= {"n_labelled", "seconds", "calib"}
    test = small_run.filter(pl.col("iteration") == 2)
    p = pred.predict(test)
    assert p.shape == (test.height,) and p.dtype == np.float64
    assert np.all((p >= 0) & (p <= 1)) and np.unique(p).size > 10
    base = pred.predict_baselines(test)
    assert set(base) == {"constant", "history"} and all(v.shape == p.shape for v in base.values())
    # warm start on refresh
    assert pred.fit(small_run).warm_start


def test_first_iteration_prior_never_crashes(small_run, fast_config):
    cfg = fast_config.model_copy(update={"first_iteration_prior": 0.3})
    pred = make_predictor(cfg)
    assert np.all(pred.predict(small_run) == 0.3)  # before any fit
    unlabelled = small_run.with_columns(pl.lit(None, dtype=pl.Float32).alias("subtree_mean_reward"))
    report = pred.fit(unlabelled)
    assert report.fallback and report.n_labelled == 0
    assert np.all(pred.predict(small_run) == 0.3)
    assert make_predictor(cfg).predict(nodes_frame([])).shape == (0,)


def test_nan_feature_rejected_naming_column(small_run, fast_config):
    bad = small_run.with_columns(pl.when(pl.col("depth") == 1).then(float("nan")).otherwise(pl.col("min_logprob"))
                                 .alias("min_logprob"))  # fmt: skip
    pred = make_predictor(fast_config)
    with pytest.raises(ValueError, match="min_logprob"):
        pred.fit(bad)
    with pytest.raises(ValueError, match="min_logprob"):
        pred.predict(bad)


def _root_rows(pid: str, outcomes: list[tuple[int, float, int]]) -> pl.DataFrame:
    rows = [{"node_id": f"{pid}-{it}", "prompt_id": pid, "iteration": it, "depth": 0, "origin": "root",
             "task": "math", "difficulty": 1, "action_text": "Compute 2 + 2.", "subtree_mean_reward": y,
             "subtree_count": c} for it, y, c in outcomes]  # fmt: skip
    return nodes_frame(rows)


def test_history_dominates_after_many_observations():
    hist = PromptHistory.from_nodes(
        _root_rows("a", [(0, 1.0, 8), (1, 1.0, 8)]), discount=1.0, prior_strength=4.0
    )
    post = hist.posterior(np.array([0.2, 0.2]), ["a", "unseen"], np.array([2, 2]))
    # 16 successes vs a prior of 4 pseudo-counts at 0.2: (0.8 + 16) / 20
    assert post[0] == pytest.approx((4 * 0.2 + 16) / 20) and post[0] > 0.8
    assert post[1] == pytest.approx(0.2)  # no record -> the model prior
    # only outcomes strictly before the query's iteration count
    assert hist.posterior(np.array([0.2]), ["a"], np.array([1]))[0] == pytest.approx((0.8 + 8) / 12)


def test_history_discount_weights_recent_outcomes_more():
    frame = _root_rows("a", [(0, 0.0, 8), (1, 1.0, 8)])
    s, n = PromptHistory.from_nodes(frame, discount=0.5, prior_strength=0.0).counts(["a"], np.array([2]))
    assert s[0] == pytest.approx(8.0) and n[0] == pytest.approx(8 * 0.5 + 8)
    flat = PromptHistory.from_nodes(frame, 1.0, 4.0).posterior(np.array([0.5]), ["a"], np.array([2]))[0]
    disc = PromptHistory.from_nodes(frame, 0.5, 4.0).posterior(np.array([0.5]), ["a"], np.array([2]))[0]
    assert disc > flat  # the recent success counts more than the old failures


def test_predictor_uses_history_for_roots(small_run, fast_config):
    strong = fast_config.model_copy(update={"history": HistoryConfig(prior_strength=1.0, discount=1.0)})
    none = fast_config.model_copy(update={"history": HistoryConfig(enabled=False)})
    train, test = small_run.filter(pl.col("iteration") < 2), small_run.filter(pl.col("iteration") == 2)
    p_strong, p_none = make_predictor(strong), make_predictor(none)
    p_strong.fit(train)
    p_none.fit(train)
    roots = test["depth"].to_numpy() == 0
    seen = np.isin(test["prompt_id"].to_numpy(), train["prompt_id"].to_numpy()) & roots
    assert seen.any()
    a, b = p_strong.predict(test), p_none.predict(test)
    assert not np.allclose(a[seen], b[seen])
    unseen_roots = roots & ~seen
    np.testing.assert_allclose(a[unseen_roots], b[unseen_roots])


@pytest.mark.parametrize("fitter", [fit_platt, fit_isotonic])
def test_calibration_improves_ece_on_miscalibrated_set(fitter):
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.05, 0.95, 4000)
    y = (rng.random(4000) < truth).astype(float)
    raw = sigmoid(2.5 * logit(truth) + 0.8)  # overconfident and biased upward
    w = np.ones_like(raw)
    cal = fitter(raw[:2000], y[:2000], w[:2000])
    before, after = ece(raw[2000:], y[2000:]), ece(cal(raw[2000:]), y[2000:])
    assert before > 0.1 and after < 0.04 and after < before / 3


def test_platt_drift_extrapolates_one_step():
    rng = np.random.default_rng(1)
    t = rng.integers(0, 4, 6000)
    truth = sigmoid(rng.normal(0, 1, 6000) + 0.5 * t)  # outcomes improve 0.5 logit per iteration
    y = (rng.random(6000) < truth).astype(float)
    raw = sigmoid(logit(truth) - 0.5 * t + 0.75)  # a model that ignores the iteration
    cal = fit_platt(raw, y, np.ones_like(raw), t)
    assert cal.c == pytest.approx(0.5, abs=0.15)
    nxt = cal(np.array([0.5]), np.array([10.0]))[0]  # clipped to one step past the last iteration
    assert nxt == pytest.approx(cal(np.array([0.5]), np.array([4.0]))[0])


def test_registry_rejects_duplicates_and_lists_known():
    assert {"hashed_mlp", "hashed_logistic", "hf_encoder"} <= set(known_predictors())
    with pytest.raises(ValueError, match="already registered"):
        register_predictor("hashed_mlp")(lambda cfg: None)
    with pytest.raises(ValueError, match="hashed_mlp"):
        make_predictor(PredictorConfig(name="nope"))


def test_logistic_variant_and_save_load(small_run, fast_config, tmp_path):
    pred = make_predictor(fast_config.model_copy(update={"name": "hashed_logistic"}))
    assert pred.config.model.hidden == 0
    pred.fit(small_run)
    path = pred.save(tmp_path / "pred.pkl")
    again = type(pred).load(path)
    np.testing.assert_allclose(again.predict(small_run), pred.predict(small_run))
