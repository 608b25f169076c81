"""Adaptive groups: how many more episodes each prompt gets once its first ones are scored.

With ``allocation.trace.grow_first`` set, the root stage samples every chosen prompt only
``grow_first`` times (a share ``grow_share`` of the budget), and the prefix stage spends the rest
on the same prompts, knowing how their first episodes ended. A prompt whose first episodes
disagree already holds a contrast: each further episode is one more trajectory with a non-zero
advantage. A prompt whose first episodes agree is likely solved (or out of reach) under the
current policy, whatever it was predicted at: its posterior says how likely more episodes are to
break the tie.

The value of ``k`` more episodes of a prompt with ``s`` successes in ``n``, predicted ``v`` with
``c`` pseudo-trajectories behind it (posterior ``p ~ Beta(c v + s, c (1 - v) + n - s)``), is the
expected number of trajectories in contrastive groups (``objective="trajectories"``: those the
update learns from)::

    F(k) = (n + k) P(the group of n + k holds a contrast)
    P = 1                      if 0 < s < n
    P = 1 - E[p^k]             if s = n      (one failure among the k breaks the tie)
    P = 1 - E[(1 - p)^k]       if s = 0

with ``E[p^k] = prod_{j<k} (a + j) / (a + b + j)``. The first episodes of a group that stays tied
are sunk; a tie broken pays for them too, so a tied group is worth growing when its posterior
still leaves room. ``plan_growth`` maximises ``sum_i F_i(k_i) - F_i(0)`` under the budget
(``knapsack.solve_table``: exact on the general hull; the tables are not concave).

Usage::

    first = first_wave(cfg)            # stage 2 plans grow_first episodes per prompt on this
    k = plan_growth(v, conc, s, n, budget=96, max_group=8)
"""

from __future__ import annotations

import numpy as np

from trace_core.allocation.config import AllocationConfig
from trace_core.allocation.inputs import check_budget, check_positive_int, check_probabilities
from trace_core.allocation.knapsack import solve_table

#: pseudo-trajectories behind a prediction when the predictor gives none (a weak prior)
DEFAULT_CONCENTRATION = 2.0


def growth_table(v, concentration, s, n, max_group: int) -> np.ndarray:
    """``(max_group + 1, N)`` table of gains ``F_i(k) - F_i(0)`` for ``k = 0..max_group`` more
    episodes (``-inf`` where ``n_i + k > max_group``)."""
    v = check_probabilities("v", v)
    s = np.asarray(s, dtype=np.int64).reshape(-1)
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    if not (v.shape == s.shape == n.shape):
        raise ValueError(f"v, s and n must have one value per prompt, got {v.shape}, {s.shape}, {n.shape}")
    if ((s < 0) | (s > n) | (n < 1)).any():
        raise ValueError("every prompt needs 0 <= successes <= episodes and at least one episode")
    K = check_positive_int("max_group", max_group)
    c = (np.full(v.shape, DEFAULT_CONCENTRATION) if concentration is None
         else np.maximum(np.broadcast_to(np.asarray(concentration, dtype=np.float64), v.shape), 1e-6))
    a = c * v + s
    b = c * (1.0 - v) + (n - s)
    mixed = (s > 0) & (s < n)
    # the outcome that would break the tie: a failure after all successes, a success after all failures
    tie_a = np.where(s == n, a, b)  # E[p^k] for s = n; E[(1-p)^k] for s = 0 (swap a and b)
    F = np.full((K + 1, v.size), -np.inf)
    F[0] = 0.0
    moment = np.ones(v.size)
    f0 = np.where(mixed, n, 0.0).astype(np.float64)
    for k in range(1, K + 1):
        moment = moment * (tie_a + k - 1) / (a + b + k - 1)
        p_contrast = np.where(mixed, 1.0, 1.0 - moment)
        F[k] = np.where(n + k <= K, (n + k) * p_contrast - f0, -np.inf)
    return F


def plan_growth(v, concentration, s, n, *, budget: int, max_group: int) -> np.ndarray:
    """More episodes per prompt (``(N,)`` int64, ``n_i + k_i <= max_group``, ``sum k <= budget``)
    maximising the expected trajectories in contrastive groups (module docstring)."""
    v = check_probabilities("v", v)
    B = int(check_budget(budget, True))
    if v.size == 0 or B < 1:
        return np.zeros(v.size, dtype=np.int64)
    F = growth_table(v, concentration, s, n, max_group)
    return np.asarray(solve_table(F, B), dtype=np.int64)


def first_wave(cfg: AllocationConfig) -> AllocationConfig:
    """The settings stage 2 plans the first episodes on: with ``trace.grow_first`` set, groups of
    exactly ``grow_first`` on ``grow_share`` of the budget, no reserve; otherwise ``cfg`` itself."""
    if cfg.strategy != "trace" or (kn := cfg.knobs("trace")).grow_first is None:
        return cfg
    g = kn.grow_first
    first = cfg.with_knobs("trace", grow_first=None, min_active=g, max_per_prompt=g, root_share=1.0)
    return first.model_copy(update={"budget_total": max(int(round(kn.grow_share * cfg.budget_total)), g)})
