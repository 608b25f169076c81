"""Metrics against hand-computed values, and the shape of evaluate_prospective's output."""

import numpy as np
import pytest

from trace_core.predictor.evaluation import auc, brier, ece, evaluate_prospective, metrics_frame, reliability


def test_auc_with_ties_hand_computed():
    # positives at 0.8, 0.5; negatives at 0.5, 0.2 -> pairs: (0.8>0.5)=1, (0.8>0.2)=1, (0.5=0.5)=.5, (0.5>0.2)=1
    p = np.array([0.8, 0.5, 0.5, 0.2])
    y = np.array([1, 1, 0, 0])
    assert auc(p, y) == pytest.approx(3.5 / 4)


def test_auc_soft_labels_equal_expanded_binary():
    # a node with mean 0.5 over 2 trajectories == one success and one failure at the same score
    soft = auc(np.array([0.9, 0.4]), np.array([0.5, 0.0]), np.array([2.0, 1.0]))
    hard = auc(np.array([0.9, 0.9, 0.4]), np.array([1.0, 0.0, 0.0]))
    # the one success (0.9) beats the failure at 0.4 and ties the failure at 0.9: (1 + 0.5) / 2
    assert soft == pytest.approx(hard) == pytest.approx(0.75)


def test_auc_single_class_is_nan():
    assert np.isnan(auc(np.array([0.1, 0.2]), np.array([1.0, 1.0])))


def test_brier_hand_computed_and_soft():
    assert brier(np.array([0.8, 0.3]), np.array([1, 0])) == pytest.approx((0.04 + 0.09) / 2)
    # soft y=0.5 at p=0.5 over 2 trajectories: each trajectory errs by 0.5 -> 0.25
    assert brier(np.array([0.5]), np.array([0.5]), np.array([2.0])) == pytest.approx(0.25)


def test_ece_and_reliability_hand_computed():
    p = np.array([0.05, 0.15, 0.15, 0.95])
    y = np.array([0, 1, 0, 1])
    bins = reliability(p, y, n_bins=10)
    assert [(b["lo"], b["count"]) for b in bins] == [(0.0, 1), (0.1, 2), (0.9, 1)]
    # bin0 |0-0.05|*1, bin1 |0.5-0.15|*2, bin9 |1-0.95|*1 over 4
    assert ece(p, y, n_bins=10) == pytest.approx((0.05 + 0.7 + 0.05) / 4)


def test_evaluate_prospective_layout_and_baselines():
    rng = np.random.default_rng(0)
    n = 200
    kind = np.where(np.arange(n) < 50, "root", "prefix")
    truth = rng.random(n)
    y = (rng.random(n) < truth).astype(float)
    res = evaluate_prospective(
        truth, y, None, kind, baselines={"constant": np.full(n, 0.5), "history": truth * 0.5}
    )
    assert res["constant_source"] == "baseline"
    for subset in ("root", "prefix", "all"):
        assert set(res[subset]) >= {"n", "weight", "model", "constant", "history"}
        assert res[subset]["model"]["auc"] > 0.6
        assert res[subset]["constant"]["auc"] == pytest.approx(0.5)
    assert res["root"]["n"] == 50 and res["prefix"]["n"] == 150
    frame = metrics_frame(res, iteration=3)
    assert set(frame.columns) == {"iteration", "subset", "predictor", "metric", "value"}
    # boolean is-root kinds are accepted; no constant baseline -> in-sample mean
    res2 = evaluate_prospective(truth, y, np.ones(n), np.arange(n) < 50)
    assert res2["constant_source"] == "in_sample" and "constant" in res2["root"]


def test_evaluate_prospective_rejects_bad_input():
    with pytest.raises(ValueError, match="kind"):
        evaluate_prospective(np.array([0.5]), np.array([1.0]), None, np.array(["leaf"]))
    with pytest.raises(ValueError, match="NaN"):
        evaluate_prospective(np.array([np.nan]), np.array([1.0]), None, np.array(["root"]))
