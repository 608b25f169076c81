"""Exact TRACE budget solvers: root (prompt) allocation and prefix (continuation) allocation.

Root problem: maximise ``sum_i V_root(v_i, m_i)`` over ``m_i in {0} | [min_active, M]`` with
``sum_i m_i <= B``. ``V_root`` is concave in ``m`` on ``[min_active, M]`` but the step from 0 to
``min_active`` is not (``V_root(v, 1) = 0``), so a plain greedy is not exact at the boundary.

Method (``_roots_exact``), O(N M) and fully vectorised:

1. *Concave hull per prompt.* The upper concave envelope of ``{(0, 0)} | {(m, V(m)): m >= a}`` is
   one *block* ``0 -> s_i`` (``s_i = argmax_{m >= a} V(m)/m``) followed by unit steps, because
   ``V`` is concave on ``[a, M]``. Spreading the block's average over its ``s_i`` units gives an
   ``(N, M)`` table of non-increasing hull slopes.
2. *Lagrangian threshold.* ``lam`` = the ``(B+1)``-th largest hull slope (``np.partition``). Every
   hull item with slope > ``lam`` is taken; items with slope == ``lam`` are taken in index order
   until the first that does not fit. This base solution ``m^G`` maximises ``V_i(m) - lam m`` for
   every prompt and leaves a slack ``r < M``.
3. *Exact repair.* With reduced costs ``c_i(m) = [V_i(m^G) - lam m^G] - [V_i(m) - lam m] >= 0``,
   ``value(m) = const - [sum_i c_i(m_i) + lam (B - sum_i m_i)]``; the base scores ``lam r``, so an
   optimum only uses options with ``c_i <= lam r``. Among optimal solutions, one with fewest
   changed prompts changes fewer than ``M^2 + 2M`` of them (Steinitz-type exchange: if at least
   ``M`` prompts go up and ``M`` go down, equal-sum subsets exist and can be reverted; a surplus
   slack of ``M`` lets one decrease be reverted). Hence keeping, for each change
   ``d = m - m^G``, the ``M^2 + 2M`` cheapest prompts and running an exact DP over their options
   (state: sum of changes) returns the optimum. Tested against brute force.

Prefix problem: ``V_pref`` is concave in ``k``, so thresholding the marginal gains is exact; the
threshold is bracketed on a strided sample and resolved exactly inside the bracket.

Per-item costs (``cost=``): knapsack with chains; equal costs reduce to the exact solvers,
otherwise greedy by gain/cost over hull items, a fill pass, and the best single item, which
guarantees at least 1/2 of the optimum (the LP bound is at most greedy + one hull item, and any
hull prefix of one row fits alone). Ties are broken deterministically: lower index first.
"""

from __future__ import annotations

import numpy as np

from trace_core.utility import iter_root_gains, prefix_value_table, root_value_columns

_TOL = 1e-12


# ----------------------------------------------------------------------------- validation
def _probabilities(name: str, x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {a.shape}")
    bad = ~np.isfinite(a) | (a < 0.0) | (a > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must hold finite values in [0, 1]; {name}[{i}] = {a[i]!r}")
    return a


def _budget(budget, integral: bool) -> float:
    b = float(budget)
    if not np.isfinite(b) or b < 0:
        raise ValueError(f"budget must be a finite number >= 0, got {budget!r}")
    return float(np.floor(b)) if integral else b


def _costs(cost, n: int) -> np.ndarray:
    c = np.broadcast_to(np.asarray(cost, dtype=np.float64), (n,)) if np.ndim(cost) == 0 else np.asarray(
        cost, dtype=np.float64
    )
    if c.shape != (n,):
        raise ValueError(f"cost must be a scalar or have shape ({n},), got shape {c.shape}")
    if not (np.isfinite(c).all() and (c > 0).all()):
        raise ValueError("cost must hold finite values > 0")
    return c


def _positive_int(name: str, x, lo: int = 1) -> int:
    if int(x) != x or x < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {x!r}")
    return int(x)


# ----------------------------------------------------------------------------- root solver
def allocate_roots(v, budget, *, max_per_prompt: int = 8, min_active: int = 2, cost=None) -> np.ndarray:
    """Rollouts per prompt maximising ``sum V_root(v_i, m_i)``.

    v: (N,) predicted success probabilities in [0, 1]. budget: total rollouts (or, with
    ``cost``, total cost units). cost: optional scalar or (N,) cost of one rollout of prompt i
    (e.g. tokens of a whole episode). Returns (N,) int64, each 0 or in
    ``[min_active, max_per_prompt]``, with ``sum(m) <= budget`` (``sum(cost*m) <= budget``).
    Exact without ``cost`` or with equal costs; >= 1/2 of the optimum with unequal costs.
    """
    v = _probabilities("v", v)
    M = _positive_int("max_per_prompt", max_per_prompt)
    a = _positive_int("min_active", min_active)
    if M < a:
        raise ValueError(f"max_per_prompt ({M}) must be >= min_active ({a})")
    if cost is None:
        return _roots_exact(v, int(_budget(budget, True)), M, a)
    c = _costs(cost, v.shape[0])
    B = _budget(budget, False)
    if v.shape[0] and np.all(c == c[0]):
        return _roots_exact(v, int(np.floor(B / c[0] * (1 + 1e-12))), M, a)
    from trace_core.allocation_cost import chain_greedy_cost

    return chain_greedy_cost(root_value_columns(v, M), a, c, B)


def _first_block(F: np.ndarray, a: int) -> np.ndarray:
    """(N,) size ``s_i`` of the first hull step ``0 -> s_i``: first argmax of ``V(m)/m``, ``m >= a``.

    F: (M+1, N) values, one contiguous row per ``m``.
    """
    M = F.shape[0] - 1
    best = F[a] / a
    s = np.full(F.shape[1], a, dtype=np.int64)
    for m in range(a + 1, M + 1):
        avg = F[m] / m
        better = avg > best  # strict: the finest item on ties
        np.copyto(best, avg, where=better)
        s[better] = m
    return s


def _hull_slopes(F: np.ndarray, s: np.ndarray) -> np.ndarray:
    """(M, N) non-increasing slopes of the concave hull: block average on units 1..s, then gains."""
    M, n = F.shape[0] - 1, F.shape[1]
    block = F[s, np.arange(n)] / s
    S = np.diff(F, axis=0)
    for j in range(M):
        np.copyto(S[j], block, where=j < s)
    # Mathematically already non-increasing; this removes rounding wiggles.
    np.minimum.accumulate(S, axis=0, out=S)
    return S


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


def _roots_exact(v: np.ndarray, B: int, M: int, a: int) -> np.ndarray:
    n = v.shape[0]
    if n == 0 or B < a:
        return np.zeros(n, dtype=np.int64)
    S, s = _root_slopes(v, M, a)
    total = n * M
    lam = 0.0 if B >= total else float(np.partition(S.ravel(), total - B - 1)[total - B - 1])
    if lam <= 0.0:  # every item with positive gain fits: take them all, skip zero-gain ones
        return (S > 0).sum(axis=0, dtype=np.int64)
    m_strict = (S > lam).sum(axis=0, dtype=np.int64)
    m_tie = (S >= lam).sum(axis=0, dtype=np.int64)
    mg = _fill_ties(m_strict, m_tie, s, B)
    return _repair(v, S, mg, lam, B - int(mg.sum()), a)


def _fill_ties(m_strict: np.ndarray, m_tie: np.ndarray, s: np.ndarray, B: int) -> np.ndarray:
    """Take threshold-tied hull items in index order until the first one that does not fit."""
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
        # A row at 0 must take its whole activation block first.
        mg[p] += avail if (mg[p] > 0 or avail >= s[p]) else 0
    return mg


def _repair_rows(v, S, mg, lam, thr, cap) -> np.ndarray:
    """Rows with an option of reduced cost <= thr (cheap bound from the adjacent hull slopes).

    Moving ``d`` units away from ``mg`` costs at least ``|d|`` times the gap between ``lam`` and
    the adjacent hull slope (slopes are monotone; off-hull points lie below the hull).
    """
    M, n = S.shape
    cols = np.arange(n)
    down = np.where(mg > 0, S[np.maximum(mg - 1, 0), cols] - lam, np.inf)
    up = np.where(mg < M, lam - S[np.minimum(mg, M - 1), cols], np.inf)
    rows = np.flatnonzero(np.minimum(down, up) <= thr + 1e-9 * max(1.0, lam))
    if rows.size > 16 * cap * (M + 1):
        # Identical (v, mg) rows have identical options: only the first `cap` of each can enter
        # any change's shortlist (ties go to the lower index).
        order = np.argsort(mg[rows], kind="stable")  # two stable passes beat a 3-key lexsort
        order = order[np.argsort(v[rows][order], kind="stable")]
        key_v, key_m = v[rows][order], mg[rows][order]
        new_group = np.r_[True, (key_v[1:] != key_v[:-1]) | (key_m[1:] != key_m[:-1])]
        start = np.maximum.accumulate(np.where(new_group, np.arange(order.size), 0))
        rows = np.sort(rows[order[(np.arange(order.size) - start) < cap]])
    return rows


def _repair(v, S, mg, lam: float, slack: int, a: int) -> np.ndarray:
    """Exact DP over the few prompts whose change can beat the base solution (module docstring)."""
    M = S.shape[0]
    if slack < 0:
        raise AssertionError("base solution exceeds the budget")
    thr = lam * slack + _TOL * max(1.0, lam * M)
    cap = M * M + 2 * M
    rows = _repair_rows(v, S, mg, lam, thr, cap)
    if rows.size == 0:
        return mg
    marr = np.arange(M + 1)[:, None]
    Fc = root_value_columns(v[rows], M)  # values only where they are needed
    g0 = mg[rows]
    cols = np.arange(rows.size)
    red = (Fc[g0, cols] - lam * g0)[None, :] - (Fc - lam * marr)
    red[1:a] = np.inf  # m in 1..a-1 is not allowed
    red[g0, cols] = np.inf  # "no change" is always in the DP
    cm, cj = np.nonzero(red <= thr)
    if cm.size == 0:
        return mg
    d = cm - g0[cj]
    o = np.argsort(red[cm, cj], kind="stable")  # cost, then row (nonzero order within m)
    o = o[np.argsort(d[o], kind="stable")]  # grouped by change d
    ds = d[o]
    rank = np.arange(o.size) - np.searchsorted(ds, ds, side="left")
    core_cols = np.unique(cj[o[rank < cap]])
    out = mg.copy()
    out[rows[core_cols]] = _dp_core(Fc[:, core_cols], g0[core_cols], slack, a)
    return out


def _dp_core(F: np.ndarray, mg: np.ndarray, slack: int, a: int) -> np.ndarray:
    """Exact DP over the core: F (M+1, C) values, mg (C,) base counts; returns (C,) counts.

    State = sum of changes ``m_i - mg_i``, bounded by ``M^2 + 2M`` (module docstring).
    """
    M, C = F.shape[0] - 1, F.shape[1]
    W = M * M + 2 * M
    width = 2 * W + 1
    dp = np.full(width, -np.inf)
    dp[W] = 0.0
    choices = np.empty((C, width), dtype=np.int16)
    options = [0] + list(range(a, M + 1))
    for i in range(C):
        g0 = mg[i]
        new = dp.copy()
        choice = np.full(width, g0, dtype=np.int16)
        for m in options:
            dlt = m - g0
            if dlt == 0:
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


# ----------------------------------------------------------------------------- prefix solver
def allocate_prefixes(v, r, budget, *, max_per_node: int = 8, cost=None) -> np.ndarray:
    """Continuations per prefix node maximising ``sum V_pref(v_i, r_i, k_i)``.

    v: (N,) prefix success probabilities; r: (N,) reward in [0, 1] of the rollout the prefix lies
    on; budget: total continuations (or cost units with ``cost``: scalar or (N,) cost of one
    continuation, e.g. tokens of the remaining turns). Returns (N,) int64 in ``[0, max_per_node]``.
    Exact without ``cost`` or with equal costs; >= 1/2 of the optimum with unequal costs.
    """
    v = _probabilities("v", v)
    r = _probabilities("r", r)
    if r.shape != v.shape:
        raise ValueError(f"r must have the shape of v {v.shape}, got {r.shape}")
    K = _positive_int("max_per_node", max_per_node)
    q = r * v + (1.0 - r) * (1.0 - v)
    if cost is None:
        return _prefix_exact(q, int(_budget(budget, True)), K)
    c = _costs(cost, v.shape[0])
    B = _budget(budget, False)
    if v.shape[0] and np.all(c == c[0]):
        return _prefix_exact(q, int(np.floor(B / c[0] * (1 + 1e-12))), K)
    from trace_core.allocation_cost import chain_greedy_cost

    return chain_greedy_cost(np.ascontiguousarray(prefix_value_table(v, r, K).T), 1, c, B)


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


def _prefix_exact(q: np.ndarray, B: int, K: int) -> np.ndarray:
    n = q.shape[0]
    if n == 0 or B == 0:
        return np.zeros(n, dtype=np.int64)
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
