"""Adaptive groups (``allocation.growth``): the value of more episodes of a prompt whose first
episodes are scored, and the plan that spends a budget on them."""

from __future__ import annotations

import numpy as np
import pytest

from trace_core.allocation.config import AllocationConfig
from trace_core.allocation.growth import first_wave, growth_table, plan_growth


def _beta_moment(a: float, b: float, k: int, draws: int = 400_000) -> float:
    return float(np.mean(np.random.default_rng(0).beta(a, b, draws) ** k))


def test_the_table_is_the_expected_trajectories_in_contrastive_groups():
    """Mixed groups gain one trajectory per episode; a tied group gains (n + k)(1 - E[p^k]) under
    its posterior Beta(c v + s, c (1 - v) + n - s), checked against Monte Carlo."""
    v, c = np.array([0.5, 0.8, 0.3]), np.array([3.0, 3.0, 3.0])
    s, n = np.array([1, 2, 0]), np.array([2, 2, 2])
    F = growth_table(v, c, s, n, max_group=6)
    assert F.shape == (7, 3) and (F[0] == 0).all()
    np.testing.assert_allclose(F[1:5, 0], [1, 2, 3, 4])
    assert np.isinf(F[5:, :]).all()  # n + k <= max_group
    for k in (1, 2, 4):
        tied_success = (2 + k) * (1 - _beta_moment(3 * 0.8 + 2, 3 * 0.2, k))
        tied_failure = (2 + k) * (1 - _beta_moment(3 * 0.7 + 2, 3 * 0.3, k))  # E[(1-p)^k]: 1-p ~ Beta(b, a)
        assert F[k, 1] == pytest.approx(tied_success, abs=0.01)
        assert F[k, 2] == pytest.approx(tied_failure, abs=0.01)


def test_the_plan_grows_mixed_groups_first_and_keeps_to_the_budget():
    v = np.array([0.5, 0.9, 0.9, 0.5, 0.5])
    c = np.array([2.0, 50.0, 0.5, 2.0, 2.0])
    s, n = np.array([1, 2, 2, 0, 1]), np.array([2, 2, 2, 2, 2])
    k = plan_growth(v, c, s, n, budget=4, max_group=4)
    np.testing.assert_array_equal(k, [2, 0, 0, 0, 2])  # the two mixed pairs, to the cap
    k = plan_growth(v, c, s, n, budget=7, max_group=4)
    assert k.sum() <= 7 and (k[[0, 4]] == 2).all() and ((n + k) <= 4).all()
    # a confident prediction keeps a tie worth breaking; a weak one that the tie confirms does not
    assert k[1] >= k[2]
    assert plan_growth(v, c, s, n, budget=0, max_group=4).sum() == 0
    # no concentration: a weak prior (the outcomes dominate)
    assert plan_growth(v, None, s, n, budget=4, max_group=4).tolist() == [2, 0, 0, 0, 2]


def test_bad_inputs_are_refused_in_one_line():
    with pytest.raises(ValueError, match="successes"):
        growth_table(np.array([0.5]), None, np.array([3]), np.array([2]), 4)
    with pytest.raises(ValueError, match="one value per prompt"):
        growth_table(np.array([0.5, 0.5]), None, np.array([1]), np.array([2]), 4)


def test_first_wave_plans_groups_of_grow_first_on_its_share():
    cfg = AllocationConfig(strategy="trace", budget_total=192, trace={"grow_first": 2, "max_per_prompt": 4})
    first = first_wave(cfg)
    kn = first.knobs()
    assert first.budget_total == round(0.67 * 192)
    assert (kn.min_active, kn.max_per_prompt, kn.root_share, kn.grow_first) == (2, 2, 1.0, None)
    plain = AllocationConfig(strategy="trace", budget_total=192)
    assert first_wave(plain) is plain
    for bad, msg in (({"grow_first": 9}, "max_per_prompt"), ({"grow_first": 2, "refill": True}, "exclusive"),
                     ({"grow_first": 2, "root_share": 0.5}, "root_share")):
        with pytest.raises(ValueError, match=msg):
            AllocationConfig(strategy="trace", trace=bad)
