"""TRACE utilities: root and prefix utilities and their marginal gains (vectorised numpy).

* Root utility ``V_root(v, m) = 1 - v^m - (1-v)^m``: the chance that ``m`` rollouts of a prompt
  with success probability ``v`` hold at least one success and one failure (a contrastive group).
  ``V_root(v, 0) = V_root(v, 1) = 0``. The gain of the ``m``-th rollout (``m >= 2``) is
  ``v(1-v)(v^(m-2) + (1-v)^(m-2))``: ``2v(1-v)`` for the second, then non-increasing.
* Prefix utility ``V_pref(v, r, k) = 1 - q^k`` with ``q = r v + (1-r)(1-v)``: the chance that ``k``
  continuations from a prefix with success probability ``v``, lying on a rollout with reward ``r``,
  contain at least one reward that differs from ``r``. Gain of the ``k``-th continuation:
  ``q^(k-1)(1-q)``, geometric, hence concave in ``k``.
* Posterior-expected root utility ``E[V_root(p, m)]`` for ``p ~ Beta(c v, c (1-v))``: a prompt
  whose success rate is known only to ``c`` pseudo-trajectories may lie near 0 or 1, where a group
  holds no contrast; the expectation ``1 - E[p^m] - E[(1-p)^m]`` (moments as running products)
  prices that. ``c = inf`` gives ``V_root(v, m)``. A mixture of the plug-in tables, so its gains
  are non-increasing from ``m = 2`` on as theirs are.
* Objective tables: the allocation solvers count either contrastive groups (the utilities above,
  ``objective="groups"``) or the trajectories in them (``objective="trajectories"``): a root
  group of ``m`` is worth ``m V_root(v, m)``, a branch group of ``k`` continuations plus the raw
  trajectory ``(k+1) V_pref(v, r, k)``. Neither is concave in the count.

All functions broadcast their arguments like numpy ufuncs and return float64 arrays.
"""

from __future__ import annotations

import numpy as np


def root_utility(v, m) -> np.ndarray:
    """``V_root(v, m)``; broadcasts ``v`` (probabilities) against ``m`` (rollout counts >= 0)."""
    v = np.asarray(v, dtype=np.float64)
    m = np.asarray(m)
    # v**0 = 1 would give -1 at m = 0; both m = 0 and m = 1 carry no contrast.
    u = 1.0 - np.power(v, m) - np.power(1.0 - v, m)
    return np.where(m >= 2, u, 0.0)


def flip_probability_base(v, r) -> np.ndarray:
    """``q = r v + (1-r)(1-v)``: chance that one continuation repeats the reward ``r``."""
    v = np.asarray(v, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    return r * v + (1.0 - r) * (1.0 - v)


def prefix_utility(v, r, k) -> np.ndarray:
    """``V_pref(v, r, k) = 1 - q^k``; broadcasts prefix probabilities, rewards and counts."""
    q = flip_probability_base(v, r)
    k = np.asarray(k)
    return np.where(k >= 1, 1.0 - np.power(q, k), 0.0)


def root_value_table(v, max_per_prompt: int) -> np.ndarray:
    """``V_root(v_i, m)`` for ``m = 0..max_per_prompt``, shape ``(N, max_per_prompt + 1)``.

    A transposed view of ``root_value_columns`` (same numbers the solvers use).
    """
    return root_value_columns(v, max_per_prompt).T


def root_value_columns(v, max_per_prompt: int) -> np.ndarray:
    """``V_root(v_i, m)`` laid out as ``(max_per_prompt + 1, N)``: one contiguous row per ``m``.

    Running sums of ``root_gain_columns`` (accurate for tiny ``v``, where ``1 - v^m - (1-v)^m``
    cancels), so solvers and checks see identical numbers.
    """
    g = root_gain_columns(v, max_per_prompt)
    out = np.empty((max_per_prompt + 1, g.shape[1]), dtype=np.float64)
    out[0] = 0.0
    np.cumsum(g, axis=0, out=out[1:])
    return out


def root_gain_columns(v, max_per_prompt: int) -> np.ndarray:
    """Gains of rollout ``m = 1..M`` as ``(M, N)``: 0, then ``v(1-v)(v^(m-2) + (1-v)^(m-2))``.

    Running products (no ``np.power``): exactly the numbers ``iter_root_gains`` yields.
    """
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    out = np.empty((max_per_prompt, v.shape[0]), dtype=np.float64)
    for j, g in enumerate(iter_root_gains(v, max_per_prompt)):
        out[j] = g
    return out


def iter_root_gains(v: np.ndarray, max_per_prompt: int):
    """Yield the (N,) gain of rollout ``m`` for ``m = 1..max_per_prompt`` (column by column)."""
    w = 1.0 - v
    pq = v * w
    pv = np.ones_like(v)
    pw = np.ones_like(v)
    yield np.zeros_like(v)
    for m in range(2, max_per_prompt + 1):
        if m > 2:
            pv = pv * v
            pw = pw * w
        yield pq * (pv + pw)


def root_gain_table(v, max_per_prompt: int) -> np.ndarray:
    """Marginal gains of root rollouts, shape ``(N, max_per_prompt)``.

    Column ``j`` holds ``V_root(v, j+1) - V_root(v, j)``: column 0 is 0 (one rollout has no
    contrast), column 1 is ``2v(1-v)``, later columns ``v(1-v)(v^(m-2) + (1-v)^(m-2))``.
    """
    return root_gain_columns(v, max_per_prompt).T


def prefix_gain_table(v, r, max_per_node: int) -> np.ndarray:
    """Marginal gains ``q^(k-1)(1-q)`` of continuations ``k = 1..max_per_node``, shape ``(N, K)``."""
    q = flip_probability_base(v, r).reshape(-1)
    out = np.empty((q.shape[0], max_per_node), dtype=np.float64)
    g = 1.0 - q
    for j in range(max_per_node):  # repeated multiplication: identical bits to prefix_gains_column
        out[:, j] = g
        g = g * q
    return out


def prefix_gains_column(q: np.ndarray, k: int) -> np.ndarray:
    """Gain of the ``k``-th continuation (1-based) given ``q``, computed exactly as in the table."""
    g = 1.0 - q
    for _ in range(k - 1):
        g = g * q
    return g


def prefix_value_table(v, r, max_per_node: int) -> np.ndarray:
    """``V_pref`` for ``k = 0..max_per_node`` as running sums of the gains, shape ``(N, K + 1)``."""
    g = prefix_gain_table(v, r, max_per_node)
    out = np.zeros((g.shape[0], max_per_node + 1), dtype=np.float64)
    np.cumsum(g, axis=1, out=out[:, 1:])
    return out


def expected_root_value_columns(v, concentration, max_per_prompt: int) -> np.ndarray:
    """``E[V_root(p, m)]`` for ``p ~ Beta(c v, c (1 - v))``, laid out ``(max_per_prompt + 1, N)``.

    ``concentration`` ``c``: scalar or (N,) pseudo-trajectories behind each ``v`` (> 0); ``inf``
    rows are the plug-in ``root_value_columns`` bit for bit. ``E[p^m] = prod_{j<m} (a+j)/(c+j)``
    with ``a = c v``, as running products.
    """
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    c = np.broadcast_to(np.asarray(concentration, dtype=np.float64), v.shape)
    if np.any(~(c > 0)):
        raise ValueError("concentration must be > 0 (inf: a known success rate)")
    out = root_value_columns(v, max_per_prompt)
    fin = np.flatnonzero(np.isfinite(c))
    if fin.size == 0:
        return out
    vf, cf = v[fin], c[fin]
    a, b = cf * vf, cf * (1.0 - vf)
    ep, eq = np.ones_like(vf), np.ones_like(vf)
    for m in range(1, max_per_prompt + 1):
        ep = ep * (a + m - 1) / (cf + m - 1)
        eq = eq * (b + m - 1) / (cf + m - 1)
        out[m, fin] = np.maximum(1.0 - ep - eq, 0.0) if m >= 2 else 0.0
    return out


def root_objective_table(v, max_per_prompt: int, objective: str = "groups", concentration=None) -> np.ndarray:
    """Per-prompt allocation objective for ``m = 0..max_per_prompt``, shape ``(N, M + 1)``:
    ``V_root(v, m)`` (``"groups"``) or ``m V_root(v, m)`` (``"trajectories"``); with
    ``concentration`` each is the expectation under the prompt's Beta posterior
    (``expected_root_value_columns``)."""
    F = (root_value_table(v, max_per_prompt) if concentration is None
         else expected_root_value_columns(v, concentration, max_per_prompt).T)
    return F * np.arange(max_per_prompt + 1)[None, :] if _objective(objective) == "trajectories" else F


def prefix_objective_table(v, r, max_per_node: int, objective: str = "groups") -> np.ndarray:
    """Per-node allocation objective for ``k = 0..max_per_node``, shape ``(N, K + 1)``:
    ``V_pref(v, r, k)`` (``"groups"``) or ``(k+1) V_pref(v, r, k)`` (``"trajectories"``)."""
    F = prefix_value_table(v, r, max_per_node)
    return F * np.arange(1, max_per_node + 2)[None, :] if _objective(objective) == "trajectories" else F


def _objective(objective: str) -> str:
    if objective not in ("groups", "trajectories"):
        raise ValueError(f"objective must be 'groups' or 'trajectories', got {objective!r}")
    return objective
