"""Root / prefix utilities and their gain tables against the closed forms."""

import numpy as np
import pytest

from trace_core.utility import (
    prefix_gain_table,
    prefix_objective_table,
    prefix_utility,
    prefix_value_table,
    root_gain_table,
    root_objective_table,
    root_utility,
    root_value_table,
)


def test_root_utility_closed_form_and_edges():
    v = np.array([0.0, 0.25, 0.5, 1.0])
    assert np.allclose(root_utility(v, 0), 0.0)
    assert np.allclose(root_utility(v, 1), 0.0)
    assert np.allclose(root_utility(v, 2), 2 * v * (1 - v))
    assert root_utility(0.5, 8) == pytest.approx(1 - 2 * 0.5**8)
    # broadcasting: (4, 1) x (3,) -> (4, 3)
    assert root_utility(v[:, None], np.array([2, 3, 4])).shape == (4, 3)


def test_root_gains_match_formula_and_decrease():
    v = np.linspace(0, 1, 41)
    g = root_gain_table(v, 8)
    assert np.allclose(g[:, 0], 0.0)
    for m in range(2, 9):
        expect = v * (1 - v) * (v ** (m - 2) + (1 - v) ** (m - 2))
        assert np.allclose(g[:, m - 1], expect, atol=1e-15)
    assert np.all(np.diff(g[:, 1:], axis=1) <= 1e-15)
    assert np.allclose(root_value_table(v, 8), root_utility(v[:, None], np.arange(9)[None, :]))


def test_prefix_utility_closed_form():
    v = np.array([0.2, 0.2, 0.0, 1.0])
    r = np.array([1, 0, 0, 1])
    q = np.array([0.2, 0.8, 1.0, 1.0])
    assert np.allclose(prefix_utility(v, r, 3), 1 - q**3)
    assert np.allclose(prefix_utility(v, r, 0), 0.0)
    g = prefix_gain_table(v, r, 5)
    assert np.allclose(g, q[:, None] ** np.arange(5)[None, :] * (1 - q[:, None]))
    assert np.allclose(prefix_value_table(v, r, 5), prefix_utility(v[:, None], r[:, None], np.arange(6)[None, :]))


def test_objective_tables_count_groups_or_trajectories():
    v = np.array([0.0, 0.3, 0.5])
    r = np.array([1.0, 0.0, 1.0])
    m = np.arange(9)[None, :]
    assert np.array_equal(root_objective_table(v, 8), root_value_table(v, 8))
    assert np.allclose(root_objective_table(v, 8, "trajectories"), m * root_utility(v[:, None], m))
    assert np.array_equal(prefix_objective_table(v, r, 8, "groups"), prefix_value_table(v, r, 8))
    assert np.allclose(prefix_objective_table(v, r, 8, "trajectories"),
                       (m + 1) * prefix_utility(v[:, None], r[:, None], m))
    with pytest.raises(ValueError, match="objective"):
        root_objective_table(v, 8, "rollouts")
