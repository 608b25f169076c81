"""Continuation flips: pairs from the node table, the per-(r, depth) bins, the logistic layer."""

import numpy as np
import polars as pl
import pytest

from trace_core.predictor import make_predictor
from trace_core.predictor.config import FlipConfig
from trace_core.predictor.flip import FlipModel, continuation_pairs, with_remaining


def test_pairs_link_each_continuation_to_its_branch_prefix_and_raw_reward(small_run):
    pairs = continuation_pairs(small_run)
    ext = small_run.filter(pl.col("origin") == "extension")
    assert pairs["n"].sum() == ext["is_leaf"].sum()  # every continuation counted once
    branch = small_run.filter(pl.col("node_id").is_in(pairs["node_id"].implode()))
    assert set(branch["origin"].unique().to_list()) == {"raw"} and not branch["is_leaf"].any()
    # recompute one branch by hand
    row = pairs.row(0, named=True)
    b = small_run.filter(pl.col("node_id") == row["node_id"]).row(0, named=True)
    r = small_run.filter(pl.col("is_leaf") & (pl.col("trajectory_id") == b["trajectory_id"]))["reward"][0]
    firsts = ext.filter(pl.col("parent_id") == row["node_id"])["trajectory_id"]
    ys = ext.filter(pl.col("is_leaf") & pl.col("trajectory_id").is_in(firsts.implode()))["reward"].to_numpy()
    assert row["r"] == r and row["n"] == len(ys) and row["f"] == np.sum((ys > 0.5) != (r > 0.5))


def test_remaining_turns_from_the_raw_leaf(small_run):
    pre = small_run.filter((pl.col("depth") == 1) & (pl.col("origin") == "raw"))
    out = with_remaining(pre, small_run)
    leaf_depth = dict(small_run.filter(pl.col("is_leaf")).select("trajectory_id", "depth").iter_rows())
    want = [max(leaf_depth[t] - 1, 1) for t in pre["trajectory_id"]]
    np.testing.assert_allclose(out["remaining"].to_numpy(), want)
    given = with_remaining(pre.with_columns(pl.lit(7).alias("remaining")))
    assert np.all(given["remaining"].to_numpy() == 7)


def _pairs_world(rng, n: int):
    """Failed trajectories flip at 2% past depth 1; successful ones at 30%. V says 0.5 everywhere."""
    r = rng.integers(0, 2, n).astype(float)
    depth = rng.integers(1, 4, n).astype(float)
    rate = np.where(r > 0.5, 0.3, np.where(depth > 1, 0.02, 0.15))
    k = np.full(n, 2.0)
    f = rng.binomial(2, rate).astype(float)
    return dict(v=np.full(n, 0.5), r=r, depth=depth, remaining=np.full(n, 2.0), errors=np.zeros(n), n=k, f=f,
                w=np.ones(n), rate=rate)  # fmt: skip


def test_bins_move_the_success_based_prior_toward_observed_flips():
    rng = np.random.default_rng(0)
    world = _pairs_world(rng, 150)  # 300 continuations, bins only
    model = FlipModel(FlipConfig(min_continuations=10_000))
    assert np.allclose(model.predict(world["v"], world["r"], world["depth"], world["remaining"], world["errors"]), 0.5)
    info = model.fit(*(world[k] for k in ("v", "r", "depth", "remaining", "errors", "n", "f", "w")))
    assert not info["logistic"] and info["continuations"] == 300
    q = model.predict(np.full(4, 0.5), np.array([0, 0, 1, 1.0]), np.array([1, 3, 1, 3.0]), np.full(4, 2.0), np.zeros(4))
    # failed and deep: rarely; every bin well below the paper's r(1-V) + (1-r)V = 0.5 (5 pseudo-counts of it)
    assert q[1] < 0.2 and q[1] < q[0] < 0.4 and q[2] < 0.45


def test_logistic_layer_once_there_is_data():
    rng = np.random.default_rng(1)
    world = _pairs_world(rng, 2000)
    model = FlipModel(FlipConfig())
    assert model.fit(*(world[k] for k in ("v", "r", "depth", "remaining", "errors", "n", "f", "w")))["logistic"]
    q = model.predict(world["v"], world["r"], world["depth"], world["remaining"], world["errors"])
    for rate in np.unique(world["rate"]):
        m = world["rate"] == rate
        assert q[m].mean() == pytest.approx(rate, abs=0.03)
    again = FlipModel.from_state(FlipConfig(), model.state())
    np.testing.assert_allclose(again.predict(world["v"][:20], world["r"][:20], world["depth"][:20],
                                             world["remaining"][:20], world["errors"][:20]), q[:20])  # fmt: skip


def test_predict_flip_needs_r_and_is_a_probability(small_run, fast_config):
    pred = make_predictor(fast_config)
    pred.fit(small_run.filter(pl.col("iteration") < 2))
    frame = small_run.filter(pl.col("iteration") == 2)
    with pytest.raises(ValueError, match="'r'"):
        pred.predict_flip(frame)
    leaves = frame.filter(pl.col("is_leaf")).select("trajectory_id", pl.col("reward").alias("r"))
    pre = frame.join(leaves, on="trajectory_id", how="left").with_columns(pl.col("r").fill_null(0.0))
    q = pred.predict_flip(pre)
    assert q.shape == (pre.height,) and np.all((q > 0) & (q < 1))
