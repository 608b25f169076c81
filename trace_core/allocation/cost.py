"""Per-item costs (a token budget: a continuation from turn t costs only the remaining turns, a
fresh rollout a whole episode): a knapsack over chains of hull items.

Equal costs go to the exact solvers (``roots.py``, ``prefixes.py``); otherwise greedy by
gain/cost over hull items, a fill pass and the best single row, which guarantees at least 1/2 of
the optimum (the LP bound is at most greedy + one hull item, and any hull prefix of one row fits
alone). This holds for any hull, so non-concave objectives (``concave=False``) only change how
the hull is found. ``min_gain`` prices each cost unit (the values fall by ``min_gain * cost * m``)
and the bound then holds for the priced objective. Tested against brute force."""

from __future__ import annotations

import numpy as np

from trace_core.allocation.hull import TOL, block_vertices, first_block, table_vertices, vertex_slopes

_FILL_SCAN = 200_000  # items the (sequential) fill pass looks at; the 1/2 bound does not need it


def chain_greedy_cost(F: np.ndarray, a: int, c: np.ndarray, B: float, *, concave: bool = True,
                      min_gain: float = 0.0) -> np.ndarray:
    """Greedy by gain/cost over hull items + fill + best single row; >= 1/2 of the optimum.

    F: (M+1, N) values for m = 0..M; a: smallest positive count allowed (1..a-1 never chosen);
    c: (N,) cost per unit; B: budget in cost units. concave: F is concave on ``[a, M]`` (one
    block then unit steps; else the general hull). min_gain: price of one cost unit. The greedy
    prefix is vectorised; only the fill pass after the first misfit loops, over the items that
    still fit. Returns (N,) int64 counts.
    """
    M, n = F.shape[0] - 1, F.shape[1]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    cap = np.minimum(M, np.floor(B / c * (1 + 1e-12))).astype(np.int64)  # alone-feasible maximum
    counts = np.arange(M + 1)[:, None]
    g = F - (min_gain * c)[None, :] * counts if min_gain else F.copy()
    g[counts > cap[None, :]] = -np.inf  # beyond the row's cap: never chosen
    if concave:
        s = np.where(cap >= a, first_block(g, a), M + 1)  # M + 1: the row cannot afford its block
        vertex = block_vertices(s, M) & (counts <= cap[None, :])
    else:
        g[1:a] = -np.inf
        vertex = table_vertices(g)
    rows, start, end = _hull_items(vertex)
    slope = vertex_slopes(g, vertex)[end - 1, rows]  # monotone along each row
    item_cost = c[rows] * (end - start)
    keep = slope > 0
    rows, start, end, slope, item_cost = rows[keep], start[keep], end[keep], slope[keep], item_cost[keep]
    order = np.lexsort((start, rows, -(slope / c[rows])))
    fits = np.cumsum(item_cost[order]) <= B * (1 + 1e-12)
    k = int(np.argmin(fits)) if not fits.all() else order.size
    m = np.zeros(n, dtype=np.int64)
    np.maximum.at(m, rows[order[:k]], end[order[:k]])  # hull slopes fall along a row: a prefix per row
    room = B - float(item_cost[order[:k]].sum())
    _fill(m, order[k:], rows, start, end, item_cost, room)
    return _best_single_row(m, g, a)


def _fill(m: np.ndarray, rest: np.ndarray, rows, start, end, item_cost, room: float) -> None:
    """After the first misfit: take, in greedy order, each next hull item of a row that still fits."""
    rest = rest[item_cost[rest] <= room * (1 + 1e-12)][:_FILL_SCAN]
    tail_min = np.minimum.accumulate(item_cost[rest][::-1])[::-1]  # cheapest item still ahead
    for idx, it in enumerate(rest):
        if room < tail_min[idx] * (1 - 1e-12):
            break
        rw = rows[it]
        if m[rw] == start[it] and item_cost[it] <= room * (1 + 1e-12):
            m[rw] = end[it]
            room -= item_cost[it]


def _best_single_row(m: np.ndarray, g: np.ndarray, a: int) -> np.ndarray:
    """The greedy, or one row alone at its best affordable count if that is worth more."""
    n, cols = m.shape[0], np.arange(m.shape[0])
    h = g.copy()
    h[1:a] = -np.inf
    best_m = h.shape[0] - 1 - np.argmax(h[::-1], axis=0)  # last argmax: the cap when g rises
    best_val = h[best_m, cols]
    b = int(np.argmax(best_val))
    if best_val[b] > g[m, cols].sum() + TOL:
        m = np.zeros(n, dtype=np.int64)
        m[b] = best_m[b]
    return m


def _hull_items(vertex: np.ndarray):
    """Hull items (row, start, end): one per pair of consecutive hull vertices of a row."""
    M = vertex.shape[0] - 1
    idx = np.arange(M + 1)[:, None]
    nxt = np.minimum.accumulate(np.where(vertex, idx, M + 1)[::-1], axis=0)[::-1]  # first vertex >= m
    after = nxt[1:]  # first vertex > m, for m = 0..M-1
    start, rows = np.nonzero(vertex[:-1] & (after <= M))
    return rows, start.astype(np.int64), after[start, rows].astype(np.int64)
