"""Exact prefix allocation: how many continuations each open prefix node gets.

Maximise ``sum_i F(v_i, r_i, k_i)`` over ``k_i in [0, K]`` with ``sum_i k_i <= B``, where the
per-node objective ``F`` is

* ``"groups"`` (default): ``V_pref(v, r, k) = 1 - q^k``, ``q = r v + (1-r)(1-v)``, the chance
  that the branch group holds a reward flip. Concave in ``k`` (geometric gains), so thresholding
  the gains is exact; the threshold is bracketed on a strided sample and resolved exactly inside
  the bracket, without an (N, K) table.
* ``"trajectories"``: ``(k+1) V_pref(v, r, k)``, the trajectories of the branch group (``k``
  continuations plus the raw trajectory) that learn from it. Not concave: the exact threshold +
  repair solver on its general hull (``knapsack.solve_table``).

``min_gain`` prices every continuation, so a step is bought only if it is worth more than
``min_gain`` per continuation (pass the root stage's ``marginal_threshold`` to share one price).
"""

from __future__ import annotations

import numpy as np

from trace_core.allocation.config import Objective
from trace_core.allocation.cost import chain_greedy_cost
from trace_core.allocation.inputs import (
    check_budget,
    check_costs,
    check_min_gain,
    check_objective,
    check_positive_int,
    check_probabilities,
)
from trace_core.allocation.knapsack import solve_table
from trace_core.utility import prefix_objective_table


def allocate_prefixes(v, r, budget, *, max_per_node: int = 8, cost=None, objective: Objective = "groups",
                      min_gain: float = 0.0) -> np.ndarray:
    """Continuations per prefix node maximising ``sum F(v_i, r_i, k_i) - min_gain * sum k_i``.

    v: (N,) prefix success probabilities; r: (N,) reward in [0, 1] of the rollout the prefix lies
    on; budget: total continuations (or cost units with ``cost``: scalar or (N,) cost of one
    continuation, e.g. tokens of the remaining turns). objective: ``"groups"`` counts branch
    groups with a flip (``V_pref``), ``"trajectories"`` the trajectories in them
    (``(k+1) V_pref``). min_gain: price of one budget unit (a continuation; a cost unit with
    ``cost``); steps worth exactly that much are left out. Returns (N,) int64 in
    ``[0, max_per_node]``. Exact without ``cost`` or with equal costs; >= 1/2 of the optimum with
    unequal costs.
    """
    v = check_probabilities("v", v)
    r = check_probabilities("r", r)
    if r.shape != v.shape:
        raise ValueError(f"r must have the shape of v {v.shape}, got {r.shape}")
    K = check_positive_int("max_per_node", max_per_node)
    objective = check_objective(objective)
    mu = check_min_gain(min_gain)
    q = r * v + (1.0 - r) * (1.0 - v)
    if cost is None:
        return _prefix_exact(v, r, q, int(check_budget(budget, True)), K, objective, mu)
    c = check_costs(cost, v.shape[0])
    B = check_budget(budget, False)
    if v.shape[0] and np.all(c == c[0]):
        return _prefix_exact(v, r, q, int(np.floor(B / c[0] * (1 + 1e-12))), K, objective, mu * c[0])
    F = np.ascontiguousarray(prefix_objective_table(v, r, K, objective).T)
    return chain_greedy_cost(F, 1, c, B, concave=objective == "groups", min_gain=mu)


def _prefix_exact(v, r, q, B: int, K: int, objective: str, mu: float) -> np.ndarray:
    if objective == "groups":
        return _prefix_groups(q, B, K, mu)
    F = np.ascontiguousarray(prefix_objective_table(v, r, K, objective).T)
    return solve_table(F, B, key=q, min_gain=mu)


def _prefix_groups(q: np.ndarray, B: int, K: int, mu: float = 0.0) -> np.ndarray:
    n = q.shape[0]
    if n == 0 or B == 0:
        return np.zeros(n, dtype=np.int64)
    if mu > 0.0:  # priced: if every gain above the price fits, that is the optimum
        _, c_mu = _count_above(q, K, np.inf, np.nextafter(mu, np.inf))
        if int(c_mu.sum(dtype=np.int64)) <= B:
            return c_mu.astype(np.int64)
        # else the B best gains all beat the price: the unpriced solution below
    hi, lo = _sample_bracket(q, K, B)
    for _attempt in range(2):
        # lo == 0 means "every positive gain": then c_lo counts them all.
        c_hi, c_lo = _count_above(q, K, hi, lo if lo > 0.0 else np.nextafter(0.0, 1.0))
        n_lo = int(c_lo.sum(dtype=np.int64))
        if lo <= 0.0 and n_lo <= B:  # every item with positive gain fits
            return c_lo.astype(np.int64)
        if int(c_hi.sum(dtype=np.int64)) <= B < n_lo:
            break
        hi, lo = np.inf, 0.0  # sample bracket missed: widen to everything (rare, still exact)
    return _resolve_bracket(q, K, B, c_hi.astype(np.int64), c_lo.astype(np.int64))


def _count_above(q: np.ndarray, K: int, hi: float, lo: float):
    """Per row: #gains > hi and #gains >= lo (gains built column by column, no (N, K) table)."""
    n = q.shape[0]
    dt = np.int8 if K < 127 else np.int32
    c_hi, c_lo = np.zeros(n, dtype=dt), np.zeros(n, dtype=dt)
    g = 1.0 - q
    mask = np.empty(n, dtype=bool)
    for j in range(K):
        if hi < np.inf:
            np.greater(g, hi, out=mask)
            c_hi += mask
        np.greater_equal(g, lo, out=mask)
        c_lo += mask
        if j + 1 < K:
            np.multiply(g, q, out=g)
    return c_hi, c_lo


def _sample_bracket(q: np.ndarray, K: int, B: int) -> tuple[float, float]:
    """Values bracketing the (B+1)-th largest gain, from a strided sample (deterministic)."""
    n = q.shape[0]
    step = max(1, n // 100_000)
    qs = q[::step]
    g = np.empty((qs.shape[0], K))
    col = 1.0 - qs
    for j in range(K):
        g[:, j] = col
        col = col * qs
    flat = np.sort(g.ravel())[::-1]
    size = flat.size
    p = min(1.0, (B + 1) / (n * K))
    rank = p * size
    margin = 8.0 * np.sqrt(size * p * (1 - p)) + 4.0
    hi_rank, lo_rank = int(rank - margin), int(np.ceil(rank + margin))
    hi = np.inf if hi_rank < 0 else float(flat[hi_rank])
    lo = 0.0 if lo_rank >= size else float(flat[lo_rank])
    return hi, lo


def _resolve_bracket(q: np.ndarray, K: int, B: int, c_hi: np.ndarray, c_lo: np.ndarray) -> np.ndarray:
    """Take the best ``B - sum(c_hi)`` gains inside the bracket, ties by (row, k)."""
    rows = np.flatnonzero(c_lo > c_hi)
    width = (c_lo - c_hi)[rows]
    rep = np.repeat(rows, width)
    offs = np.arange(rep.size) - np.repeat(np.cumsum(width) - width, width)
    k = c_hi[rep] + 1 + offs  # 1-based continuation index
    qr = q[rep]
    g = 1.0 - qr
    for j in range(1, K):  # same operation sequence as _count_above: identical bits
        g = np.where(k > j, g * qr, g)
    need = B - int(c_hi.sum())
    take = np.lexsort((k, rep, -g))[:need]
    return c_hi + np.bincount(rep[take], minlength=q.shape[0])
