"""Root values under each prompt's Beta posterior (``allocation.trace.root_posterior``)."""

import numpy as np
import pytest

from tests.allocation.test_strategies import alloc, with_knobs
from trace_core.allocation import allocate_roots
from trace_core.allocation.planner import plan_prefixes, plan_roots
from trace_core.utility import expected_root_value_columns, root_objective_table, root_value_columns


def test_expected_value_is_the_beta_expectation():
    v = np.array([0.1, 0.4, 0.5, 0.93])
    c = np.array([1.0, 3.0, 12.0, 40.0])
    E = expected_root_value_columns(v, c, 8)
    a, b = c * v, c * (1 - v)
    # E[V(2)] = 2 E[p (1 - p)] = 2ab / (c (c + 1)), and E[V(0)] = E[V(1)] = 0
    assert np.allclose(E[2], 2 * a * b / (c * (c + 1)))
    assert np.all(E[:2] == 0)
    # against sampling p ~ Beta(a, b)
    p = np.random.default_rng(0).beta(a, b, size=(400_000, 4))
    for m in (3, 5, 8):
        assert np.allclose(E[m], (1 - p**m - (1 - p) ** m).mean(0), atol=3e-3)
    # below the plug-in value at the mean (Jensen: uncertain prompts may sit near 0 or 1), and
    # gains still non-increasing from the second rollout on
    assert np.all(E[2:] < root_value_columns(v, 8)[2:])
    assert np.all(np.diff(np.diff(E[1:], axis=0), axis=0) <= 1e-12)


def test_infinite_concentration_is_the_plug_in_value_bit_for_bit():
    v = np.random.default_rng(1).uniform(0, 1, 50)
    assert np.array_equal(expected_root_value_columns(v, np.inf, 8), root_value_columns(v, 8))
    assert np.array_equal(root_objective_table(v, 8, "trajectories", np.inf), root_objective_table(v, 8, "trajectories"))
    m = allocate_roots(v, 120, max_per_prompt=8, min_active=4)
    assert np.array_equal(allocate_roots(v, 120, max_per_prompt=8, min_active=4, concentration=np.inf), m)
    with pytest.raises(ValueError, match="concentration"):
        allocate_roots(v, 120, concentration=0.0)


def test_a_prompt_known_by_its_own_record_beats_an_unseen_one_of_the_same_mean():
    # two candidates at v = 0.5: one known only from its cell (prior strength 2), one whose own
    # record (2 + 30 trajectories) puts it there; budget for one group of 4
    v = np.array([0.5, 0.5])
    unseen_first = allocate_roots(v, 4, max_per_prompt=8, min_active=4, concentration=np.array([2.0, 32.0]))
    seen_first = allocate_roots(v, 4, max_per_prompt=8, min_active=4, concentration=np.array([32.0, 2.0]))
    assert unseen_first.tolist() == [0, 4] and seen_first.tolist() == [4, 0]
    # the plug-in value cannot tell them apart: the tie goes by index
    assert allocate_roots(v, 4, max_per_prompt=8, min_active=4).tolist() == [4, 0]


def test_the_planner_uses_the_posterior_only_where_the_knob_is_on():
    rng = np.random.default_rng(3)
    v = rng.uniform(0.05, 0.95, 64)
    conc = rng.uniform(1.0, 30.0, 64)
    strata = ["math"] * 32 + ["qa"] * 32
    off = alloc("trace", budget_total=96, stratify="task")
    on = with_knobs(off, root_posterior=True)
    plain = plan_roots(v, off, np.random.default_rng(0), strata=strata)
    same = plan_roots(v, off, np.random.default_rng(0), strata=strata, concentration=conc)
    assert np.array_equal(plain.m, same.m) and plain.price == same.price
    post = plan_roots(v, on, np.random.default_rng(0), strata=strata, concentration=conc)
    assert not np.array_equal(post.m, plain.m)
    assert post.used <= post.budget and post.price > 0
    # the chosen prompts are better known than the plug-in plan's
    assert conc[post.m > 0].mean() > conc[plain.m > 0].mean()
    # GRPO never looks at it
    g = alloc("grpo", budget_total=96, group_size=4)
    assert np.array_equal(plan_roots(v, g, np.random.default_rng(0), concentration=conc).m,
                          plan_roots(v, g, np.random.default_rng(0)).m)
    # the second wave values prompts as the first did, and its sizes must match the candidates
    pv, r = rng.uniform(0.05, 0.95, 10), (rng.uniform(size=10) > 0.5).astype(float)
    d, rem = np.ones(10, dtype=int), np.full(10, 3)
    wave = plan_prefixes(post, v, pv, r, d, rem, post.used, on, np.random.default_rng(0), strata=strata,
                         prefix_strata=["math"] * 5 + ["qa"] * 5, concentration=conc)
    assert wave.continuations + wave.wave_rollouts <= on.budget_total - post.used
    with pytest.raises(ValueError, match="concentration has 3 values"):
        plan_roots(v, on, np.random.default_rng(0), concentration=conc[:3])
