"""Exact solvers against brute-force DP, cost-budget bound, validation, hypothesis invariants;
both objectives (groups, trajectories), prices (min_gain) and the marginal threshold."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_core.allocation import allocate_prefixes, allocate_roots, marginal_threshold
from trace_core.allocation.hull import table_vertices, vertex_slopes
from trace_core.allocation.knapsack import solve_table
from trace_core.utility import (
    prefix_objective_table,
    prefix_value_table,
    root_objective_table,
    root_value_table,
)


# ----------------------------------------------------------------------------- brute force
def _dp(values: np.ndarray, options: list[int], weights: np.ndarray, budget: int) -> float:
    """max sum_i values[i, m_i] s.t. sum_i weights[i] * m_i <= budget; integer weights."""
    best = np.zeros(budget + 1)  # best[b]: best value using at most b
    for i in range(values.shape[0]):
        new = best.copy()
        for m in options:
            w = int(weights[i]) * m
            if m == 0 or w > budget:
                continue
            cand = np.full(budget + 1, -np.inf)
            cand[w:] = best[: budget + 1 - w] + values[i, m]
            new = np.maximum(new, cand)
        best = new
    return float(best[-1])


def brute_roots(v, budget, M, a, weights=None):
    f = root_value_table(v, M)
    w = np.ones(len(v), dtype=int) if weights is None else weights
    return _dp(f, [0, *range(a, M + 1)], w, int(budget))


def brute_prefixes(v, r, budget, K, weights=None):
    f = prefix_value_table(v, r, K)
    w = np.ones(len(v), dtype=int) if weights is None else weights
    return _dp(f, list(range(K + 1)), w, int(budget))


def root_value(v, m, M):
    return float(root_value_table(v, M)[np.arange(len(v)), m].sum())


def prefix_value(v, r, k, K):
    return float(prefix_value_table(v, r, K)[np.arange(len(v)), k].sum())


def _random_probs(rng, n):
    kind = rng.integers(4)
    if kind == 0:  # the edge values, many ties
        return rng.choice([0.0, 0.5, 1.0], size=n)
    if kind == 1:  # coarse grid: many exact ties between prompts (and v vs 1 - v)
        return rng.integers(0, 11, size=n) / 10.0
    if kind == 2:
        return rng.beta(0.3, 0.3, size=n)  # mass near 0 and 1
    return rng.random(n)


def _check_roots(m, budget, M, a):
    assert m.dtype.kind == "i"
    assert np.all((m == 0) | ((m >= a) & (m <= M)))
    assert m.sum() <= budget


# ----------------------------------------------------------------------------- roots
def test_roots_equal_brute_force_on_random_small_instances():
    rng = np.random.default_rng(0)
    for _ in range(600):
        n = int(rng.integers(1, 8))
        M = int(rng.integers(1, 9))
        a = int(rng.integers(1, M + 1))
        v = _random_probs(rng, n)
        budget = int(rng.choice([0, 1, rng.integers(0, n * M + 1), n * M + 5]))
        m = allocate_roots(v, budget, max_per_prompt=M, min_active=a)
        _check_roots(m, budget, M, a)
        assert root_value(v, m, M) == pytest.approx(brute_roots(v, budget, M, a), abs=1e-9)


def test_roots_equal_brute_force_with_many_ties_at_scale():
    """Hundreds of tied prompts stress the threshold tie fill and the repair's core selection."""
    rng = np.random.default_rng(1)
    for _ in range(12):
        n = int(rng.integers(50, 300))
        M, a = int(rng.integers(3, 9)), int(rng.integers(2, 4))
        v = rng.choice([0.03, 0.1, 0.5, 0.9, 0.97, 1.0], size=n)
        budget = int(rng.integers(0, n * M))
        m = allocate_roots(v, budget, max_per_prompt=M, min_active=min(a, M))
        _check_roots(m, budget, M, min(a, M))
        assert root_value(v, m, M) == pytest.approx(brute_roots(v, budget, M, min(a, M)), abs=1e-9)


def test_plain_greedy_is_not_exact_but_solver_is():
    # Budget 3 with min_active 2: greedy takes the best block (2) and strands 1 unit; the optimum
    # here is a single group of 3 on the prompt whose third rollout is worth more.
    v = np.array([0.5, 0.45])
    assert allocate_roots(v, 3).tolist() in ([3, 0], [0, 3])
    assert root_value(v, allocate_roots(v, 3), 8) == pytest.approx(brute_roots(v, 3, 8, 2))


def test_roots_edge_budgets_and_tie_breaking():
    v = np.array([0.5, 0.5, 0.5])
    assert allocate_roots(v, 0).tolist() == [0, 0, 0]
    assert allocate_roots(v, 1).tolist() == [0, 0, 0]
    assert allocate_roots(v, 4).tolist() == [2, 2, 0]  # lower index first among equals
    assert allocate_roots(v, 100).tolist() == [8, 8, 8]
    assert allocate_roots(np.array([0.0, 1.0, 0.5]), 100).tolist() == [0, 0, 8]  # no wasted rollouts
    assert allocate_roots(np.array([]), 5).tolist() == []
    np.testing.assert_array_equal(allocate_roots(v, 7), allocate_roots(v, 7))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"v": [0.5, np.nan], "budget": 4}, "v"),
        ({"v": [0.5, np.inf], "budget": 4}, "v"),
        ({"v": [1.2], "budget": 4}, "v"),
        ({"v": [[0.5]], "budget": 4}, "v"),
        ({"v": [0.5], "budget": -1}, "budget"),
        ({"v": [0.5], "budget": np.nan}, "budget"),
        ({"v": [0.5], "budget": 4, "max_per_prompt": 2, "min_active": 3}, "max_per_prompt"),
        ({"v": [0.5], "budget": 4, "min_active": 0}, "min_active"),
        ({"v": [0.5, 0.5], "budget": 4, "cost": [1.0]}, "cost"),
        ({"v": [0.5], "budget": 4, "cost": [0.0]}, "cost"),
    ],
)
def test_roots_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        allocate_roots(**kwargs)


@pytest.mark.parametrize(
    "args, match",
    [
        (([0.5], [1, 0], 3), "r"),
        (([0.5], [2.0], 3), "r"),
        (([np.nan], [1.0], 3), "v"),
        (([0.5], [1.0], -2), "budget"),
    ],
)
def test_prefix_validation(args, match):
    with pytest.raises(ValueError, match=match):
        allocate_prefixes(*args)


# ----------------------------------------------------------------------------- prefixes
def test_prefixes_equal_brute_force():
    rng = np.random.default_rng(2)
    for _ in range(400):
        n = int(rng.integers(1, 8))
        K = int(rng.integers(1, 9))
        v = _random_probs(rng, n)
        r = rng.integers(0, 2, size=n).astype(float)
        budget = int(rng.choice([0, 1, rng.integers(0, n * K + 1), n * K + 3]))
        k = allocate_prefixes(v, r, budget, max_per_node=K)
        assert np.all((k >= 0) & (k <= K)) and k.sum() <= budget
        assert prefix_value(v, r, k, K) == pytest.approx(brute_prefixes(v, r, budget, K), abs=1e-9)


def test_prefixes_large_exact_threshold_and_ties():
    """Above the sampling stride (bracketed threshold) the result still equals the sorted greedy."""
    rng = np.random.default_rng(3)
    n, K = 300_000, 4
    v = rng.choice([0.1, 0.5, 0.8], size=n)  # massive ties
    r = rng.integers(0, 2, size=n).astype(float)
    for budget in (1, 12_345, 400_000, n * K):
        k = allocate_prefixes(v, r, budget, max_per_node=K)
        assert k.sum() == min(budget, n * K)
        q = r * v + (1 - r) * (1 - v)
        g = q[:, None] ** np.arange(K)[None, :] * (1 - q[:, None])
        best = np.sort(g.ravel())[::-1][:budget].sum()
        assert prefix_value(v, r, k, K) == pytest.approx(best, rel=1e-9)
    k = allocate_prefixes(np.full(6, 0.5), np.ones(6), 3, max_per_node=4)
    assert k.tolist() == [1, 1, 1, 0, 0, 0]  # lower index first


def test_prefix_zero_gain_nodes_get_nothing():
    v = np.array([1.0, 0.0, 0.5])
    r = np.array([1.0, 0.0, 1.0])  # q = 1, 1, 0.5: no flip possible on the first two
    assert allocate_prefixes(v, r, 100, max_per_node=3).tolist() == [0, 0, 3]


# ----------------------------------------------------------------------------- cost budgets
def test_cost_greedy_at_least_half_of_optimum():
    rng = np.random.default_rng(4)
    ratios = []
    for _ in range(300):
        n = int(rng.integers(1, 6))
        M = int(rng.integers(2, 7))
        v = _random_probs(rng, n)
        w = rng.integers(1, 6, size=n)
        budget = int(rng.integers(0, int(w.sum()) * M + 2))
        m = allocate_roots(v, budget, max_per_prompt=M, min_active=2, cost=w)
        _check_roots(m, budget, M, 2)
        assert (w * m).sum() <= budget
        opt = brute_roots(v, budget, M, 2, weights=w)
        got = root_value(v, m, M)
        assert got >= 0.5 * opt - 1e-9
        ratios.append(got / opt if opt > 0 else 1.0)
        r = rng.integers(0, 2, size=n).astype(float)
        k = allocate_prefixes(v, r, budget, max_per_node=M, cost=w)
        assert (w * k).sum() <= budget and np.all(k <= M)
        opt_p = brute_prefixes(v, r, budget, M, weights=w)
        assert prefix_value(v, r, k, M) >= 0.5 * opt_p - 1e-9
    assert np.mean(ratios) > 0.95  # in practice close to optimal; the guarantee is 1/2


def test_equal_costs_are_exact():
    rng = np.random.default_rng(5)
    for _ in range(50):
        v = rng.random(6)
        m = allocate_roots(v, 37.5, cost=2.5)  # 15 rollouts
        assert root_value(v, m, 8) == pytest.approx(brute_roots(v, 15, 8, 2), abs=1e-9)


# ----------------------------------------------------------------------------- properties
probs = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=0, max_size=12)


@settings(max_examples=150, deadline=None)
@given(v=probs, budget=st.integers(0, 120), M=st.integers(1, 8), a=st.integers(1, 8))
def test_root_invariants(v, budget, M, a):
    a = min(a, M)
    v = np.array(v, dtype=float)
    m = allocate_roots(v, budget, max_per_prompt=M, min_active=a)
    _check_roots(m, budget, M, a)
    val = root_value(v, m, M)
    assert root_value(v, allocate_roots(v, budget + 1, max_per_prompt=M, min_active=a), M) >= val - 1e-12
    perm = np.random.default_rng(len(v)).permutation(len(v))
    m_p = allocate_roots(v[perm], budget, max_per_prompt=M, min_active=a)
    assert root_value(v[perm], m_p, M) == pytest.approx(val, abs=1e-9)  # equivariant up to ties


@settings(max_examples=150, deadline=None)
@given(
    vr=st.lists(st.tuples(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0])), max_size=12),
    budget=st.integers(0, 120),
    K=st.integers(1, 8),
)
def test_prefix_invariants(vr, budget, K):
    v = np.array([x for x, _ in vr], dtype=float)
    r = np.array([y for _, y in vr], dtype=float)
    k = allocate_prefixes(v, r, budget, max_per_node=K)
    assert np.all((k >= 0) & (k <= K)) and k.sum() <= budget
    val = prefix_value(v, r, k, K)
    assert prefix_value(v, r, allocate_prefixes(v, r, budget + 1, max_per_node=K), K) >= val - 1e-12
    perm = np.random.default_rng(len(v)).permutation(len(v))
    k_p = allocate_prefixes(v[perm], r[perm], budget, max_per_node=K)
    assert prefix_value(v[perm], r[perm], k_p, K) == pytest.approx(val, abs=1e-9)


# ----------------------------------------------------------------------------- objectives and prices
def _priced(table: np.ndarray, mu: float) -> np.ndarray:
    return table - mu * np.arange(table.shape[1])[None, :]


def _random_price(rng) -> float:
    return float(rng.choice([0.0, 0.0, 0.05, rng.random() * 0.5, rng.random() * 2.0]))


@pytest.mark.parametrize("objective", ["groups", "trajectories"])
def test_objectives_and_prices_equal_brute_force(objective):
    """Both problems, priced or not; every bought step is worth >= the price per unit."""
    rng = np.random.default_rng(10 if objective == "groups" else 11)
    for _ in range(500):
        n, M = int(rng.integers(1, 8)), int(rng.integers(1, 9))
        a = int(rng.integers(1, M + 1))
        v, r = _random_probs(rng, n), rng.integers(0, 2, size=n).astype(float)
        budget = int(rng.choice([0, 1, rng.integers(0, n * M + 1), n * M + 5]))
        mu = _random_price(rng)
        m = allocate_roots(v, budget, max_per_prompt=M, min_active=a, objective=objective, min_gain=mu)
        k = allocate_prefixes(v, r, budget, max_per_node=M, objective=objective, min_gain=mu)
        _check_roots(m, budget, M, a)
        assert k.dtype.kind == "i" and np.all((k >= 0) & (k <= M)) and k.sum() <= budget
        for x, table, options, lo in [(m, root_objective_table(v, M, objective), [0, *range(a, M + 1)], a),
                                      (k, prefix_objective_table(v, r, M, objective), list(range(M + 1)), 1)]:
            opt = _dp(_priced(table, mu), options, np.ones(n, dtype=int), budget)
            assert _priced(table, mu)[np.arange(n), x].sum() == pytest.approx(opt, abs=1e-9)
            assert x.sum() == 0 or marginal_threshold(table, x, min_active=lo) >= mu - 1e-9


def _random_table(rng, n, M):
    """(M+1, N) arbitrary values (any shape, some counts not allowed), F[0] = 0."""
    F = rng.random((M + 1, n)) * rng.choice([1.0, 5.0]) * np.arange(M + 1)[:, None] ** rng.choice([0.5, 1.0, 2.0])
    F[rng.random((M + 1, n)) < 0.25] = -np.inf
    F[0] = 0.0
    return F


def test_general_hull_and_solver_on_arbitrary_tables():
    rng = np.random.default_rng(17)
    for _ in range(300):
        n, M = int(rng.integers(1, 7)), int(rng.integers(1, 9))
        F = _random_table(rng, n, M)
        vertex = table_vertices(F)
        S = vertex_slopes(F, vertex)
        hull = np.vstack([np.zeros(n), np.cumsum(S, axis=0)])
        ok = np.isfinite(F)
        assert np.all(hull[ok] >= F[ok] - 1e-9) and np.allclose(hull[vertex], F[vertex])
        for m in range(M + 1):  # brute force: a vertex is on no chord's strict underside
            for i in range(n):
                under = any(ok[a, i] and ok[b, i] and F[m, i] < F[a, i] + (F[b, i] - F[a, i]) * (m - a) / (b - a)
                            for a in range(m) for b in range(m + 1, M + 1))
                assert vertex[m, i] == (ok[m, i] and not under)
        budget, mu = int(rng.integers(0, n * M + 2)), float(rng.choice([0.0, rng.random()]))
        x = solve_table(F, budget, min_gain=mu)
        priced = (F - mu * np.arange(M + 1)[:, None]).T
        assert x.sum() <= budget and np.all(np.isfinite(priced[np.arange(n), x]))
        opt = _dp(np.where(np.isfinite(priced), priced, -1e9), list(range(M + 1)), np.ones(n, dtype=int), budget)
        assert priced[np.arange(n), x].sum() == pytest.approx(opt, abs=1e-9)


def test_trajectory_objectives_with_many_ties_at_scale():
    """Hundreds of tied items through the general hull, the tie fill and the repair's core."""
    rng = np.random.default_rng(14)
    for i in range(16):
        n, M = int(rng.integers(50, 300)), int(rng.integers(3, 9))
        a = min(int(rng.integers(1, 4)), M)
        v = rng.choice([0.01, 0.03, 0.1, 0.5, 0.9, 0.97, 1.0], size=n) if i % 2 else rng.beta(0.3, 0.3, n)
        r = rng.integers(0, 2, size=n).astype(float)
        budget, mu = int(rng.integers(0, n * M)), float(rng.choice([0.0, rng.random()]))
        m = allocate_roots(v, budget, max_per_prompt=M, min_active=a, objective="trajectories", min_gain=mu)
        table = _priced(root_objective_table(v, M, "trajectories"), mu)
        opt = _dp(table, [0, *range(a, M + 1)], np.ones(n, dtype=int), budget)
        assert table[np.arange(n), m].sum() == pytest.approx(opt, abs=1e-8)
        k = allocate_prefixes(v, r, budget, max_per_node=M, objective="trajectories", min_gain=mu)
        table = _priced(prefix_objective_table(v, r, M, "trajectories"), mu)
        opt = _dp(table, list(range(M + 1)), np.ones(n, dtype=int), budget)
        assert table[np.arange(n), k].sum() == pytest.approx(opt, abs=1e-8)


def test_trajectories_objective_is_not_concave_and_differs_from_groups():
    # V_root(v, m) rises with m, so a rollout is worth most inside a full group: counting
    # trajectories, 8 rollouts go to one prompt; counting groups, they spread (2+2+2+2 ties 3+3+2).
    v = np.full(4, 0.5)
    assert allocate_roots(v, 8, objective="trajectories").tolist() == [8, 0, 0, 0]
    assert allocate_roots(v, 8).tolist() == [3, 3, 2, 0]
    assert allocate_roots(v, 8, objective="groups").tolist() == [3, 3, 2, 0]  # the default
    # A prefix with q = 0.9: 1 continuation is worth 2 * 0.1 = 0.2 trajectories, 4 are worth 5 * 0.34.
    k = allocate_prefixes(np.full(4, 0.9), np.ones(4), 4, max_per_node=4, objective="trajectories")
    assert k.tolist() == [4, 0, 0, 0]
    assert allocate_prefixes(np.full(4, 0.9), np.ones(4), 4, max_per_node=4).tolist() == [1, 1, 1, 1]


def test_min_gain_leaves_out_steps_worth_less():
    v = np.array([0.5, 0.5, 0.02])  # V_root(v, 2) / 2 = v (1 - v): 0.25, 0.25, 0.0196
    assert allocate_roots(v, 100, max_per_prompt=2).tolist() == [2, 2, 2]
    assert allocate_roots(v, 100, max_per_prompt=2, min_gain=0.1).tolist() == [2, 2, 0]
    assert allocate_roots(v, 100, max_per_prompt=2, min_gain=0.25).tolist() == [0, 0, 0]  # ties: left out
    # Continuation gains q^(k-1) (1 - q): q = 0.5 gives 0.5, 0.25, 0.125 | 0.0625; q = 0.9 gives 0.1 | 0.09.
    k = allocate_prefixes(np.array([0.5, 0.9]), np.ones(2), 100, max_per_node=8, min_gain=0.095)
    assert k.tolist() == [3, 1]


def test_marginal_threshold_definition_and_shared_price():
    v = np.array([0.5, 0.5, 0.5])
    table = root_objective_table(v, 8)
    assert marginal_threshold(table, allocate_roots(v, 4), min_active=2) == pytest.approx(0.25)
    assert marginal_threshold(table, np.array([3, 0, 0]), min_active=2) == pytest.approx(0.25)  # collinear
    assert marginal_threshold(table, np.array([4, 2, 0]), min_active=2) == pytest.approx(0.125)
    assert marginal_threshold(table, np.zeros(3, dtype=int)) == 0.0
    assert marginal_threshold(table, np.array([4, 2, 0]), min_active=2, cost=2.0) == pytest.approx(0.0625)
    # Brute-force definition: the cheapest per-unit value of giving back a bought step.
    rng = np.random.default_rng(15)
    for _ in range(200):
        n, M, a = int(rng.integers(1, 6)), 6, int(rng.integers(1, 4))
        tab = root_objective_table(_random_probs(rng, n), M, rng.choice(["groups", "trajectories"]))
        m = rng.choice([0, *range(a, M + 1)], size=n)
        steps = [(tab[i, m[i]] - tab[i, lo]) / (m[i] - lo) for i in range(n) for lo in [0, *range(a, M + 1)]
                 if lo < m[i]]
        assert marginal_threshold(tab, m, min_active=a) == pytest.approx(min(steps) if steps else 0.0)
    # One price across stages: the prefix stage priced at the threshold of its own budget-B
    # solution buys exactly that solution back from an unlimited budget (concave gains, no ties).
    v, r = rng.random(40), rng.integers(0, 2, 40).astype(float)
    for budget in (1, 17, 100):
        k = allocate_prefixes(v, r, budget)
        lam = marginal_threshold(prefix_objective_table(v, r, 8), k)
        again = allocate_prefixes(v, r, 10_000, min_gain=float(np.nextafter(lam, 0.0)))
        assert again.tolist() == k.tolist()


def test_objectives_with_costs():
    rng = np.random.default_rng(16)
    for _ in range(200):
        n, M = int(rng.integers(1, 6)), int(rng.integers(2, 7))
        v, w = _random_probs(rng, n), rng.integers(1, 6, size=n)
        r = rng.integers(0, 2, size=n).astype(float)
        budget, mu = int(rng.integers(0, int(w.sum()) * M + 2)), float(rng.choice([0.0, 0.05]))
        m = allocate_roots(v, budget, max_per_prompt=M, cost=w, objective="trajectories", min_gain=mu)
        assert (w * m).sum() <= budget and np.all((m == 0) | ((m >= 2) & (m <= M)))
        table = root_objective_table(v, M, "trajectories") - mu * w[:, None] * np.arange(M + 1)[None, :]
        opt = _dp(table, [0, *range(2, M + 1)], w, budget)
        assert table[np.arange(n), m].sum() >= 0.5 * opt - 1e-9
        if m.sum():
            assert marginal_threshold(table + mu * w[:, None] * np.arange(M + 1), m, min_active=2,
                                      cost=w) >= mu - 1e-9
        k = allocate_prefixes(v, r, budget, max_per_node=M, cost=w, objective="trajectories")
        table = prefix_objective_table(v, r, M, "trajectories")
        assert (w * k).sum() <= budget
        assert table[np.arange(n), k].sum() >= 0.5 * _dp(table, list(range(M + 1)), w, budget) - 1e-9
    v = rng.random(6)
    m = allocate_roots(v, 37.5, cost=2.5, objective="trajectories", min_gain=0.01)  # 15 rollouts, 0.025 each
    assert m.tolist() == allocate_roots(v, 15, objective="trajectories", min_gain=0.025).tolist()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: allocate_roots([0.5], 4, objective="rollouts"), "objective"),
        (lambda: allocate_prefixes([0.5], [1.0], 4, objective="group"), "objective"),
        (lambda: allocate_roots([0.5], 4, min_gain=-0.1), "min_gain"),
        (lambda: allocate_prefixes([0.5], [1.0], 4, min_gain=np.nan), "min_gain"),
        (lambda: marginal_threshold(np.zeros((2, 3)), np.array([1])), "counts"),
        (lambda: marginal_threshold(np.zeros((2, 3)), np.array([1, 3])), "counts"),
    ],
)
def test_objective_and_price_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_iteration_budget_tracks_cumulative_tokens():
    """budget_tokens: each iteration buys the tokens still owed at the last price, bounded to
    [0.5, 2] x one iteration's worth; budget_total at iteration 0 and without a token budget."""
    from trace_core.allocation.config import AllocationConfig
    from trace_core.allocation.planner import iteration_budget

    cfg = AllocationConfig(budget_total=64, budget_tokens=6_000)
    assert iteration_budget(cfg, 0, 0, None) == 64
    assert iteration_budget(AllocationConfig(budget_total=64), 3, 9_999, 50.0) == 64
    assert iteration_budget(cfg, 1, 6_000, 50.0) == 120           # on track: 6,000 tokens at 50 each
    assert iteration_budget(cfg, 1, 4_000, 50.0) == 160           # 8,000 owed
    assert iteration_budget(cfg, 1, 0, 50.0) == 240               # capped at 2x
    assert iteration_budget(cfg, 1, 11_000, 50.0) == 60           # overspent: floor 0.5x
    assert iteration_budget(cfg, 1, 6_000, 25.0) == 240           # cheaper trajectories buy more
