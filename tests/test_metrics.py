"""Effective ratio, waste, tokens and gradient energy on hand-made groups; expectations by Monte Carlo."""

import numpy as np
import pytest

from trace_core import metrics
from trace_core.utility import root_utility


def test_effective_ratio_on_root_groups():
    group = np.array([0, 0, 0, 1, 1, 2, 2])
    reward = np.array([1, 0, 1, 1, 1, 0, 0])
    assert metrics.effective_ratio(group, reward) == pytest.approx(3 / 7)
    assert metrics.wasted_trajectories(group, reward) == 4
    assert metrics.effective_ratio([], []) == 0.0


def test_membership_in_two_groups_counts_the_trajectory_once():
    # raw rollouts t0, t1 (root group "p", both 1) ; t0 anchors prefix group "x" with continuations t2, t3
    group = np.array(["p", "p", "x", "x", "x"])
    traj = np.array(["t0", "t1", "t0", "t2", "t3"])
    reward = np.array([1, 1, 1, 0, 1])
    ids, eff = metrics.effective_mask(group, reward, traj)
    assert dict(zip(ids.tolist(), eff.tolist(), strict=True)) == {"t0": True, "t1": False, "t2": True, "t3": True}
    assert metrics.effective_ratio(group, reward, traj) == pytest.approx(3 / 4)
    tokens = np.array([100, 100, 100, 50, 50])  # t0's tokens listed twice, counted once
    assert metrics.effective_per_1k_tokens(group, reward, tokens, traj) == pytest.approx(1000 * 3 / 300)


def test_gradient_energy_and_advantages():
    group = np.array([0, 0, 1, 1])
    reward = np.array([1.0, 0.0, 1.0, 1.0])
    assert metrics.advantages(group, reward).tolist() == [0.5, -0.5, 0.0, 0.0]
    assert metrics.gradient_energy(group, reward) == pytest.approx(0.5 / 4)


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match="group and reward"):
        metrics.effective_ratio([0, 1], [1.0])
    with pytest.raises(ValueError, match="trajectory"):
        metrics.effective_ratio([0, 1], [1.0, 0.0], [0])
    with pytest.raises(ValueError, match="tokens"):
        metrics.effective_per_1k_tokens([0, 1], [1.0, 0.0], [3])


def test_expected_root_metrics_match_monte_carlo():
    rng = np.random.default_rng(0)
    v = np.array([0.1, 0.5, 0.9, 0.0])
    m = np.array([8, 2, 4, 3])
    exp_ratio = metrics.expected_effective_ratio(v, m)
    assert exp_ratio == pytest.approx((m * root_utility(v, m)).sum() / m.sum())
    assert metrics.expected_wasted(v, m) == pytest.approx(m.sum() * (1 - exp_ratio))
    group = np.repeat(np.arange(4), m)
    sims = [metrics.effective_ratio(group, rng.random(group.size) < v[group]) for _ in range(4000)]
    assert np.mean(sims) == pytest.approx(exp_ratio, abs=0.01)
    eff, n = metrics.expected_prefix_effective([0.3], [1.0], [4])
    assert n == 4 and eff == pytest.approx(4 * (1 - 0.3**4))


def test_trajectory_metrics_on_a_node_table():
    import polars as pl

    from trace_core.metrics import trajectory_metrics

    nodes = pl.DataFrame({
        "trajectory_id": [None, "a", "a", "b", "c"],
        "depth": [0, 1, 2, 1, 1],
        "is_leaf": [False, False, True, True, True],
        "reward": [None, None, 1.0, 0.0, 0.0],
        "advantage": [None, 0.5, 0.5, -0.5, 0.0],
        "new_tokens": [0, 10, 5, 20, 30],
    })
    m = trajectory_metrics(nodes)
    assert (m["trajectories"], m["effective"], m["wasted"], m["tokens"]) == (3, 2, 1, 65)
    assert abs(m["effective_ratio"] - 2 / 3) < 1e-12
    assert abs(m["effective_per_1k_tokens"] - 1000 * 2 / 65) < 1e-9
    assert abs(m["train_reward"] - 1 / 3) < 1e-9
