"""Per-item costs (a token budget: a continuation from turn t costs only the remaining turns, a
fresh rollout a whole episode): a knapsack over chains of hull items. Equal costs go to the exact
solvers in ``trace_core.allocation``; otherwise greedy by gain/cost over hull items, a fill pass
and the best single item, which guarantees at least 1/2 of the optimum (the LP bound is at most
greedy + one hull item, and any hull prefix of one row fits alone). Tested against brute force."""

from __future__ import annotations

import numpy as np

from trace_core.allocation import _TOL, _first_block, _hull_slopes

_FILL_SCAN = 200_000  # items the (sequential) fill pass looks at; the 1/2 bound does not need it


def chain_greedy_cost(F: np.ndarray, a: int, c: np.ndarray, B: float) -> np.ndarray:
    """Greedy by gain/cost over hull items + fill + best single row; >= 1/2 of the optimum.

    F: (M+1, N) values for m = 0..M; a: smallest positive count allowed (1..a-1 never chosen);
    c: (N,) cost per unit; B: budget in cost units. The greedy prefix is vectorised; only the
    fill pass after the first misfit loops, over the items that still fit.
    """
    M, n = F.shape[0] - 1, F.shape[1]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    cap = np.minimum(M, np.floor(B / c * (1 + 1e-12))).astype(np.int64)  # alone-feasible maximum
    g = F.copy()
    g[np.arange(M + 1)[:, None] > cap[None, :]] = -np.inf  # beyond the row's cap: never chosen
    s = np.where(cap >= a, _first_block(g, a), M + 1)  # M + 1: the row cannot afford its block
    rows, start, end = _hull_items(s, cap, M)
    with np.errstate(invalid="ignore"):  # -inf - -inf beyond the caps; those items do not exist
        slope = _hull_slopes(g, np.minimum(s, M))[end - 1, rows]  # monotone along each row
    item_cost = c[rows] * (end - start)
    keep = slope > 0
    rows, start, end, slope, item_cost = rows[keep], start[keep], end[keep], slope[keep], item_cost[keep]
    order = np.lexsort((start, rows, -(slope / c[rows])))
    fits = np.cumsum(item_cost[order]) <= B * (1 + 1e-12)
    k = int(np.argmin(fits)) if not fits.all() else order.size
    m = np.zeros(n, dtype=np.int64)
    np.maximum.at(m, rows[order[:k]], end[order[:k]])  # hull slopes fall along a row: a prefix per row
    room = B - float(item_cost[order[:k]].sum())
    rest = order[k:]
    rest = rest[item_cost[rest] <= room * (1 + 1e-12)][:_FILL_SCAN]
    tail_min = np.minimum.accumulate(item_cost[rest][::-1])[::-1]  # cheapest item still ahead
    for idx, it in enumerate(rest):
        if room < tail_min[idx] * (1 - 1e-12):
            break
        rw = rows[it]
        if m[rw] == start[it] and item_cost[it] <= room * (1 + 1e-12):
            m[rw] = end[it]
            room -= item_cost[it]
    best_val = np.where(cap >= a, F[cap, np.arange(n)], 0.0)
    b = int(np.argmax(best_val))
    if best_val[b] > F[m, np.arange(n)].sum() + _TOL:
        m[:] = 0
        m[b] = cap[b]
    return m


def _hull_items(s: np.ndarray, cap: np.ndarray, M: int):
    """Hull items (row, start, end): the block 0 -> s_i, then unit steps up to cap_i."""
    active = s <= cap
    rows = [np.flatnonzero(active)]
    starts = [np.zeros(rows[0].size, dtype=np.int64)]
    ends = [s[active].astype(np.int64)]
    for j in range(1, M + 1):  # unit step j-1 -> j
        rr = np.flatnonzero(active & (s < j) & (j <= cap))
        rows.append(rr)
        starts.append(np.full(rr.size, j - 1, dtype=np.int64))
        ends.append(np.full(rr.size, j, dtype=np.int64))
    return np.concatenate(rows), np.concatenate(starts), np.concatenate(ends)
