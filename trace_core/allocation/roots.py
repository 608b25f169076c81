"""Exact root (prompt) allocation: how many raw rollouts each candidate prompt gets.

Maximise ``sum_i F(v_i, m_i)`` over ``m_i in {0} | [min_active, M]`` with ``sum_i m_i <= B``, where
the per-prompt objective ``F`` is

* ``"groups"`` (default): ``V_root(v, m) = 1 - v^m - (1-v)^m``, expected contrastive groups.
  Concave in ``m`` on ``[min_active, M]``, but the step from 0 to ``min_active`` is not
  (``V_root(v, 1) = 0``): the hull is one block ``0 -> s`` then unit steps, built straight from
  ``v`` in two column sweeps (``_root_slopes``; the hot loop of a 1M-prompt allocation).
* ``"trajectories"``: ``m V_root(v, m)``, expected trajectories with a non-zero advantage (a
  contrastive group of ``m`` teaches through all ``m``). Not concave (convex for a small ``v``):
  its hull comes from the general vertex test (``knapsack.solve_table``). Its value per rollout,
  ``V_root(v, m)``, rises with ``m``, so the hull is the single chord ``0 -> M`` and an optimum
  gives nearly every chosen prompt ``M`` rollouts: fewer prompts, fuller groups.

With ``concentration`` (pseudo-trajectories behind each ``v``) either objective is its expectation
under the prompt's Beta posterior (``utility.expected_root_value_columns``): a prompt known only
from its cell may sit near 0 or 1, where its group teaches nothing, and is worth less than one
whose own record puts it near 0.5. Its table goes to the general solver (``solve_table``).

Both go to the exact threshold + repair solver (``knapsack.solve``). ``min_gain`` prices every
rollout, so a step is bought only if it is worth more than ``min_gain`` per rollout.
Per-rollout costs (``cost=``) go to the cost-aware greedy (``cost.py``) unless they are equal.
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
from trace_core.allocation.knapsack import solve, solve_table
from trace_core.utility import expected_root_value_columns, iter_root_gains, root_value_columns


def allocate_roots(v, budget, *, max_per_prompt: int = 8, min_active: int = 2, cost=None,
                   objective: Objective = "groups", min_gain: float = 0.0, concentration=None) -> np.ndarray:
    """Rollouts per prompt maximising ``sum F(v_i, m_i) - min_gain * sum m_i``.

    v: (N,) predicted success probabilities in [0, 1]. budget: total rollouts (or, with
    ``cost``, total cost units). cost: optional scalar or (N,) cost of one rollout of prompt i
    (e.g. tokens of a whole episode). objective: ``"groups"`` counts contrastive groups
    (``V_root``), ``"trajectories"`` the trajectories in them (``m V_root``). min_gain: price of
    one budget unit (a rollout; a cost unit with ``cost``): every bought step is worth at least
    that much per unit, steps worth exactly that much are left out (default 0: zero-gain
    rollouts are never bought). Returns (N,) int64, each 0 or in ``[min_active, max_per_prompt]``,
    with ``sum(m) <= budget`` (``sum(cost*m) <= budget``). Exact without ``cost`` or with equal
    costs; >= 1/2 of the optimum with unequal costs. concentration: optional scalar or (N,)
    pseudo-trajectories behind each ``v`` (> 0, ``inf`` = known): the objective becomes its
    expectation under ``Beta(c v, c (1 - v))``; None is the plug-in ``F(v, m)``.
    """
    v = check_probabilities("v", v)
    M = check_positive_int("max_per_prompt", max_per_prompt)
    a = check_positive_int("min_active", min_active)
    if M < a:
        raise ValueError(f"max_per_prompt ({M}) must be >= min_active ({a})")
    objective = check_objective(objective)
    mu = check_min_gain(min_gain)
    conc = None
    if concentration is not None:
        conc = np.broadcast_to(np.asarray(concentration, dtype=np.float64), v.shape)
        if np.any(~(conc > 0)):
            raise ValueError("concentration must be > 0 (inf: a known success rate)")
        if not np.isfinite(conc).any():
            conc = None
    if cost is None:
        if conc is not None:
            return _roots_table(v, conc, int(check_budget(budget, True)), M, a, objective, mu)
        return _roots_exact(v, int(check_budget(budget, True)), M, a, objective, mu)
    c = check_costs(cost, v.shape[0])
    B = check_budget(budget, False)
    if v.shape[0] and np.all(c == c[0]):
        units = int(np.floor(B / c[0] * (1 + 1e-12)))
        if conc is not None:
            return _roots_table(v, conc, units, M, a, objective, mu * c[0])
        return _roots_exact(v, units, M, a, objective, mu * c[0])
    return chain_greedy_cost(_root_table(v, M, objective, conc), a, c, B,
                             concave=objective == "groups", min_gain=mu)


def _root_table(v: np.ndarray, M: int, objective: str, conc=None) -> np.ndarray:
    """(M+1, N) objective values for ``m = 0..M`` (same numbers as ``utility.root_objective_table``)."""
    F = root_value_columns(v, M) if conc is None else expected_root_value_columns(v, conc, M)
    if objective == "trajectories":
        F *= np.arange(M + 1)[:, None]
    return F


def _roots_table(v: np.ndarray, conc: np.ndarray, B: int, M: int, a: int, objective: str, mu: float) -> np.ndarray:
    if v.shape[0] == 0 or B < a:
        return np.zeros(v.shape[0], dtype=np.int64)
    F = _root_table(v, M, objective, conc)
    F[1:a] = -np.inf
    return solve_table(F, B, key=v, a=a, min_gain=mu)


def _roots_exact(v: np.ndarray, B: int, M: int, a: int, objective: str, mu: float) -> np.ndarray:
    n = v.shape[0]
    if n == 0 or B < a:
        return np.zeros(n, dtype=np.int64)
    if objective != "groups":
        F = _root_table(v, M, objective)
        F[1:a] = -np.inf
        return solve_table(F, B, key=v, a=a, min_gain=mu)
    S, s = _root_slopes(v, M, a)
    counts = np.arange(M + 1)

    def vertex_row(p: int) -> np.ndarray:
        return (counts == 0) | (counts >= s[p])

    def values(rows: np.ndarray) -> np.ndarray:
        F = root_value_columns(v[rows], M)  # values only where the repair needs them
        F[1:a] = -np.inf
        return F

    return solve(S, B, values, vertex_row, key=v, a=a, min_gain=mu)


def _root_slopes(v: np.ndarray, M: int, a: int) -> tuple[np.ndarray, np.ndarray]:
    """(hull slopes (M, N), first block s (N,)) straight from ``v``, without the value table.

    Two column sweeps: the first finds ``s = argmax_{m >= a} V(m)/m``, the second writes the
    block average on units 1..s and the gains after it. Gains after the block fall in floating
    point too (products by numbers <= 1 round monotonically); clamping them by the block average
    removes the one possible rounding wiggle, so the slopes are non-increasing per row.
    """
    n = v.shape[0]
    if a <= 2 <= M:
        return _root_slopes_a2(v, M), np.full(n, 2, dtype=np.int64)
    val = np.zeros(n)
    best = np.full(n, -np.inf)
    s = np.full(n, a, dtype=np.int64)
    for m, g in enumerate(iter_root_gains(v, M), start=1):
        val += g  # identical to root_value_columns (cumsum in the same order)
        if m >= a:
            avg = val / m
            better = avg > best  # strict: the finest item on ties
            np.copyto(best, avg, where=better)
            s[better] = m
    S = np.empty((M, n))
    for j, g in enumerate(iter_root_gains(v, M)):
        if j < a:  # s >= a: always inside the block
            S[j] = best
        else:
            np.minimum(g, best, out=S[j])
            np.copyto(S[j], best, where=j < s)
    return S, s


def _root_slopes_a2(v: np.ndarray, M: int) -> np.ndarray:
    """Fast path for ``min_active <= 2``: the block is ``0 -> 2`` with average ``v(1-v)``
    (``V(3)/3 = V(2)/2`` exactly and ``V(m)/m`` falls after), then the gains, clamped by it.
    In-place column sweep: this is the hot loop of a 1M-prompt allocation."""
    n = v.shape[0]
    S = np.empty((M, n))
    w = 1.0 - v
    pq = v * w  # = V(2)/2 bit for bit: V(2) = pq * 2
    S[0] = pq
    S[1] = pq
    pv, pw, tmp = v.copy(), w.copy(), np.empty(n)
    for j in range(2, M):  # unit j+1: pq * (v^(j-1) + w^(j-1))
        if j > 2:
            np.multiply(pv, v, out=pv)
            np.multiply(pw, w, out=pw)
        np.add(pv, pw, out=tmp)
        np.multiply(tmp, pq, out=tmp)
        np.minimum(tmp, pq, out=S[j])
    return S

