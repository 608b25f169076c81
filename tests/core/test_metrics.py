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
    """Root group {a=1, b=0, c=0} is contrastive: all three raw rollouts effective. Root group
    {d=0, e=0} is not, but d owns the branch group {d=0, x=1}: d and x effective, e wasted."""
    import polars as pl

    from trace_core.metrics import trajectory_metrics, trajectory_table

    def row(node, parent, traj, depth, leaf, reward, tokens, origin="raw", prompt="P"):
        return {"iteration": 0, "node_id": node, "parent_id": parent, "prompt_id": prompt, "trajectory_id": traj,
                "depth": depth, "origin": origin, "is_leaf": leaf, "reward": reward, "new_tokens": tokens}

    nodes = pl.DataFrame([
        row("P", None, None, 0, False, None, 0, origin="root"),
        row("a1", "P", "a", 1, False, None, 10), row("a2", "a1", "a", 2, True, 1.0, 5),
        row("b1", "P", "b", 1, True, 0.0, 20), row("c1", "P", "c", 1, True, 0.0, 30),
        row("Q", None, None, 0, False, None, 0, origin="root", prompt="Q"),
        row("d1", "Q", "d", 1, False, None, 10, prompt="Q"), row("d2", "d1", "d", 2, True, 0.0, 10, prompt="Q"),
        row("e1", "Q", "e", 1, True, 0.0, 10, prompt="Q"),
        row("x2", "d1", "x", 2, True, 1.0, 7, origin="extension", prompt="Q"),
    ])
    m = trajectory_metrics(nodes)
    assert (m["trajectories"], m["effective"], m["wasted"], m["tokens"]) == (6, 5, 1, 102)
    assert dict(trajectory_table(nodes).select("trajectory_id", "effective").iter_rows()) == {
        "a": True, "b": True, "c": True, "d": True, "e": False, "x": True}
    assert abs(m["effective_ratio"] - 5 / 6) < 1e-12
    assert abs(m["effective_per_1k_tokens"] - 1000 * 5 / 102) < 1e-9
    assert abs(m["train_reward"] - 2 / 6) < 1e-9
