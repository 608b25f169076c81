"""Exact multiple-choice knapsack over per-item value tables: the engine of the exact solvers.

Problem: maximise ``sum_i F_i(m_i)`` over allowed counts ``m_i`` (``F_i(0) = 0``, ``-inf`` = not
allowed) with ``sum_i m_i <= B``, optionally priced: ``sum_i F_i(m_i) - mu m_i`` (``min_gain``).
No concavity is assumed: the solver works on each item's concave hull (``hull.py``).

Entry points: ``solve`` takes the hull slopes and builds values lazily, only for the rows the
repair needs (the fast root path); ``solve_table`` takes a whole value table and finds its
general hull (the non-concave trajectory objectives).

Method, O(N M) vectorised plus a DP over a bounded core:

1. *Lagrangian threshold.* ``lam`` = the ``(B+1)``-th largest unit slope (``np.partition``).
   Every unit with slope > ``lam`` is taken; units with slope == ``lam`` are taken in index
   order, a row up to its largest hull vertex that fits, until the first row that does not fit.
   This base solution ``m^G`` sits on hull vertices, so it maximises ``F_i(m) - lam m`` for
   every item, and leaves a slack ``r < M`` (less than one hull segment).
2. *Exact repair.* With reduced costs ``c_i(m) = [F_i(m^G) - lam m^G] - [F_i(m) - lam m] >= 0``,
   ``value(m) = value(m^G) + lam (sum m - sum m^G) - sum_i c_i(m_i)``, so an improvement only
   uses options with ``c_i <= lam r - delta``, ``delta`` the gain of the best one-row move into
   the slack (a feasible improvement; without it a slack of ``r`` admits nearly every row).
   Among optimal solutions, one with fewest changed items changes fewer than ``M^2 + M`` of them
   (Steinitz-type exchange: if ``M`` items go up and ``M`` go down, equal-sum subsets exist and
   can be reverted; otherwise no decrease can be reverted, so the slack is below ``M`` and the
   total change on the other side below ``M^2``); and every change ``d`` can use the cheapest
   items for it. Keeping, for each change ``d = m - m^G``, the ``M^2 + 2M`` cheapest items and
   running an exact DP over their options (state: sum of changes, which stays within
   ``+-(M^2 + 2M)``) returns the optimum. Tested against brute force.

``marginal_threshold`` reports the ``lam`` of any allocation: the smallest value per budget unit
among the steps it bought, the price at which another stage may outbid it (``min_gain``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trace_core.allocation.hull import TOL, table_vertices, vertex_slopes

Values = Callable[[np.ndarray], np.ndarray]  # rows (R,) -> (M+1, R) option values, -inf = not allowed
VertexRow = Callable[[int], np.ndarray]  # row -> (M+1,) bool hull vertices of that item


def solve(S: np.ndarray, B: int, values: Values, vertex_row: VertexRow, *, key=None, a: int = 1,
          min_gain: float = 0.0) -> np.ndarray:
    """Exact optimum from hull slopes and lazily built values; returns (N,) int64 counts.

    S: (M, N) unit hull slopes of the unpriced values (constant along hull segments,
    non-increasing per column, ``-inf`` past the last allowed count). values / vertex_row: the
    value table and hull vertices, asked only for the few rows the repair needs. key: (N,) with
    equal keys only for identical items (lets the repair skip duplicates) or None. a: smallest
    allowed positive count (below it nothing fits). min_gain: price ``mu`` per unit.
    Ties: lower index first; among optima the repair keeps the one using least budget.
    """
    if min_gain:  # price every unit: slopes fall by mu, values by mu m (same hull vertices)
        S = S - min_gain
        values = _priced(values, min_gain)
    return _solve(S, B, values, vertex_row, key, a, None)


def solve_table(F: np.ndarray, B: int, *, key=None, a: int = 1, min_gain: float = 0.0) -> np.ndarray:
    """Exact optimum for a whole (M+1, N) value table (``-inf`` = not allowed, ``F[0] = 0``).

    Builds the general hull (``hull.table_vertices``) and, having every value at hand, filters
    the repair's candidates by their exact reduced costs. Arguments as in ``solve``.
    """
    if min_gain:
        F = F - min_gain * np.arange(F.shape[0])[:, None]
    vertex = table_vertices(F)
    return _solve(vertex_slopes(F, vertex), B, lambda rows: F[:, rows], lambda p: vertex[:, p], key, a, F)


def _solve(S, B: int, values: Values, vertex_row: VertexRow, key, a: int, table) -> np.ndarray:
    n, M = S.shape[1], S.shape[0]
    if n == 0 or B < a:
        return np.zeros(n, dtype=np.int64)
    total = n * M
    lam = 0.0 if B >= total else float(np.partition(S.ravel(), total - B - 1)[total - B - 1])
    if lam <= 0.0:  # every unit with positive (priced) gain fits: take them all, skip the rest
        return (S > 0).sum(axis=0, dtype=np.int64)
    m_strict = (S > lam).sum(axis=0, dtype=np.int64)
    m_tie = (S >= lam).sum(axis=0, dtype=np.int64)
    mg = _fill_ties(m_strict, m_tie, B, vertex_row)
    return _repair(S, mg, lam, B - int(mg.sum()), values, key, table)


def _priced(values: Values, mu: float) -> Values:
    def priced(rows: np.ndarray) -> np.ndarray:
        F = values(rows)
        return F - mu * np.arange(F.shape[0])[:, None]

    return priced


def _fill_ties(m_strict: np.ndarray, m_tie: np.ndarray, B: int, vertex_row: VertexRow) -> np.ndarray:
    """Take threshold-tied units in index order until the first row that does not fit; that row
    goes up to its largest hull vertex within the room left."""
    mg = m_strict.copy()
    room = B - int(mg.sum())
    tie_rows = np.flatnonzero(m_tie > m_strict)
    extra = (m_tie - m_strict)[tie_rows]
    cum = np.cumsum(extra)
    k = int(np.searchsorted(cum, room, side="right"))  # first row whose tie part overflows
    mg[tie_rows[:k]] += extra[:k]
    if k < tie_rows.size:
        p = tie_rows[k]
        avail = room - (int(cum[k - 1]) if k else 0)
        reach = np.flatnonzero(vertex_row(p)[mg[p]: mg[p] + avail + 1])
        mg[p] += int(reach[-1]) if reach.size else 0  # mg[p] itself is a vertex
    return mg


def _near_rows(S, mg, lam, thr) -> np.ndarray:
    """Rows with an option of reduced cost <= thr (cheap bound from the adjacent hull slopes).

    Moving ``d`` units away from ``mg`` costs at least ``|d|`` times the gap between ``lam`` and
    the adjacent hull slope (slopes are monotone; off-hull points lie below the hull).
    """
    M, n = S.shape
    cols = np.arange(n)
    down = np.where(mg > 0, S[np.maximum(mg - 1, 0), cols] - lam, np.inf)
    up = np.where(mg < M, lam - S[np.minimum(mg, M - 1), cols], np.inf)
    return np.flatnonzero(np.minimum(down, up) <= thr + 1e-9 * max(1.0, lam))


def _cheap_rows(F, mg, lam, thr) -> np.ndarray:
    """Rows with an option of reduced cost <= thr, from the whole value table (exact)."""
    cols = np.arange(F.shape[1])
    base = F[mg, cols] - lam * mg
    least = np.full(F.shape[1], np.inf)
    for m in range(F.shape[0]):
        red = base - (F[m] - lam * m)  # +inf where not allowed
        np.minimum(least, red, out=least, where=mg != m)
    return np.flatnonzero(least <= thr + 1e-9 * max(1.0, lam))


def _distinct(rows, key, mg, cap: int, M: int) -> np.ndarray:
    """Identical (key, mg) rows have identical options: only the first ``cap`` of each can enter
    any change's shortlist (ties go to the lower index)."""
    if key is None or rows.size <= 16 * cap * (M + 1):
        return rows
    order = np.argsort(mg[rows], kind="stable")  # two stable passes beat a 3-key lexsort
    order = order[np.argsort(key[rows][order], kind="stable")]
    key_v, key_m = key[rows][order], mg[rows][order]
    new_group = np.r_[True, (key_v[1:] != key_v[:-1]) | (key_m[1:] != key_m[:-1])]
    start = np.maximum.accumulate(np.where(new_group, np.arange(order.size), 0))
    return np.sort(rows[order[(np.arange(order.size) - start) < cap]])


def _repair(S, mg, lam: float, slack: int, values: Values, key, table) -> np.ndarray:
    """Exact DP over the few items whose change can beat the base solution (module docstring).

    An option enters only if it can beat the base plus the best one-row climb into the slack
    (a feasible improvement); with the whole ``table`` both are exact, else bounds from ``S``.
    """
    M = S.shape[0]
    if slack < 0:
        raise AssertionError("base solution exceeds the budget")
    if table is None:
        thr = lam * slack - _slack_gain(S, mg, slack) + TOL * max(1.0, lam * M)
        rows = _near_rows(S, mg, lam, thr)
    else:
        thr = lam * slack - _slack_gain_table(table, mg, slack) + TOL * max(1.0, lam * M)
        rows = _cheap_rows(table, mg, lam, thr)
    cap = M * M + 2 * M
    rows = _distinct(rows, key, mg, cap, M)
    if rows.size == 0:
        return mg
    marr = np.arange(M + 1)[:, None]
    Fc = values(rows)  # values only where they are needed
    g0 = mg[rows]
    cols = np.arange(rows.size)
    red = (Fc[g0, cols] - lam * g0)[None, :] - (Fc - lam * marr)  # +inf where not allowed
    red[g0, cols] = np.inf  # "no change" is always in the DP
    core_cols = _shortlist(red, g0, thr, cap)
    if core_cols.size == 0:
        return mg
    out = mg.copy()
    out[rows[core_cols]] = _dp_core(Fc[:, core_cols], g0[core_cols], slack)
    return out


def _shortlist(red: np.ndarray, g0: np.ndarray, thr: float, cap: int) -> np.ndarray:
    """Columns of ``red`` (M+1, R) among the ``cap`` cheapest options <= thr of every change
    ``d = m - g0`` (ties: by count ``m``, then column), in increasing order."""
    M1, R = red.shape
    cols = np.arange(R)
    picked = []
    for d in range(1 - M1, M1):
        m = g0 + d
        ok = (d != 0) & (m >= 0) & (m < M1)
        cost = np.where(ok, red[np.clip(m, 0, M1 - 1), cols], np.inf)
        cand = np.flatnonzero(cost <= thr)
        if cand.size > cap:
            c = cost[cand]
            kth = np.partition(c, cap - 1)[cap - 1]
            tied = cand[c == kth]
            tied = tied[np.argsort(g0[tied], kind="stable")]  # (m, column) order within d
            below = cand[c < kth]
            cand = np.concatenate([below, tied[: cap - below.size]])
        picked.append(cand)
    return np.unique(np.concatenate(picked))


def _slack_gain(S: np.ndarray, mg: np.ndarray, slack: int) -> float:
    """Best value one row adds by climbing its hull from ``mg`` to a vertex within ``slack``.

    A feasible improvement of the base, read off the unit slopes: the end of a run of equal
    slopes is a hull vertex, where the hull (a running minimum of the slopes, so never above it)
    meets the value table. Without it a slack of ``r`` lets every row within ``lam r`` of the
    threshold into the repair (all of them, when gains are spread out).
    """
    M, n = S.shape
    if slack <= 0:
        return 0.0
    cols = np.arange(n)
    gain, best = np.zeros(n), 0.0
    for u in range(1, min(slack, M) + 1):
        top = mg + u  # climb to count top: units mg .. top-1
        inside = top <= M
        unit = S[np.minimum(top - 1, M - 1), cols]
        gain += np.where(inside, unit, 0.0)
        after = S[np.minimum(top, M - 1), cols]
        at_vertex = inside & np.isfinite(unit) & ((top == M) | (after != unit))
        if at_vertex.any():
            best = max(best, float(gain[at_vertex].max()))
    return best


def _slack_gain_table(F: np.ndarray, mg: np.ndarray, slack: int) -> float:
    """Best value one row adds by moving up to any allowed count within ``slack`` (exact)."""
    M = F.shape[0] - 1
    cols, best = np.arange(F.shape[1]), 0.0
    for u in range(1, min(slack, M) + 1):
        top = np.minimum(mg + u, M)
        gain = np.where(mg + u <= M, F[top, cols] - F[mg, cols], -np.inf)
        best = max(best, float(gain.max()))
    return best


def _dp_core(F: np.ndarray, mg: np.ndarray, slack: int) -> np.ndarray:
    """Exact DP over the core: F (M+1, C) values (-inf = not allowed), mg (C,) base counts.

    State = sum of changes ``m_i - mg_i``, bounded by ``M^2 + 2M`` (module docstring).
    """
    M, C = F.shape[0] - 1, F.shape[1]
    W = M * M + 2 * M
    width = 2 * W + 1
    dp = np.full(width, -np.inf)
    dp[W] = 0.0
    choices = np.empty((C, width), dtype=np.int16)
    for i in range(C):
        g0 = mg[i]
        new = dp.copy()
        choice = np.full(width, g0, dtype=np.int16)
        for m in range(M + 1):
            dlt = m - g0
            if dlt == 0 or F[m, i] == -np.inf:
                continue
            shifted = np.full(width, -np.inf)
            if dlt > 0:
                shifted[dlt:] = dp[:-dlt]
            else:
                shifted[:dlt] = dp[-dlt:]
            shifted += F[m, i] - F[g0, i]
            better = shifted > new  # strict: on ties keep the base choice
            np.copyto(new, shifted, where=better)
            choice[better] = m
        dp = new
        choices[i] = choice
    state = int(np.argmax(dp[: W + slack + 1]))  # first maximum: least budget among optima
    out = mg.copy()
    for i in range(C - 1, -1, -1):
        out[i] = int(choices[i, state])
        state -= out[i] - mg[i]
    return out


def marginal_threshold(values, counts, *, min_active: int = 1, cost=None) -> float:
    """The ``lam`` of an allocation: the smallest value per budget unit among the steps it bought.

    values: (N, M+1) objective of item ``i`` at count ``m`` (``utility.root_objective_table`` /
    ``prefix_objective_table``); counts: (N,) the allocation; min_active: smallest non-zero count
    allowed (a step may not end in ``1..min_active-1``); cost: optional scalar or (N,) cost of
    one unit (then the result is per cost unit). For every item with ``m_i > 0`` the cheapest way
    to give budget back is ``min over allowed m' < m_i of (F_i(m_i) - F_i(m')) / (m_i - m')``;
    the result is the minimum over items, 0.0 when nothing was bought.

    An exact solution with ``min_gain=mu`` always has ``marginal_threshold >= mu``; passing the
    result as ``min_gain`` to another stage's solver buys there only what beats this stage.
    """
    F = np.asarray(values, dtype=np.float64)
    m = np.asarray(counts)
    if F.ndim != 2 or m.shape != F.shape[:1]:
        raise ValueError(f"values must be (N, M+1) and counts (N,), got {F.shape} and {m.shape}")
    M = F.shape[1] - 1
    if m.size and (m.min() < 0 or m.max() > M or np.any(m != np.round(m))):
        raise ValueError(f"counts must be integers in [0, {M}]")
    m = m.astype(np.int64)
    rows = np.flatnonzero(m > 0)
    if rows.size == 0:
        return 0.0
    Fr, mr = F[rows], m[rows]
    top = Fr[np.arange(rows.size), mr]
    lam = np.full(rows.size, np.inf)
    for lower in [0, *range(max(min_active, 1), M)]:
        ok = lower < mr
        with np.errstate(divide="ignore", invalid="ignore"):
            step = (top - Fr[:, lower]) / (mr - lower)
        np.minimum(lam, step, out=lam, where=ok)
    if cost is not None:
        lam = lam / np.broadcast_to(np.asarray(cost, dtype=np.float64), m.shape)[rows]
    return float(lam.min())
