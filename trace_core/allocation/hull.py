"""Upper concave hulls of per-item value tables, seen by the solvers as per-unit slopes.

A value table ``F`` has shape ``(M+1, N)``: column ``i`` holds item ``i``'s value for the counts
``m = 0..M`` (one contiguous row per ``m``, the layout of ``utility.root_value_columns``);
``F[0] = 0``; ``-inf`` marks a count that is not allowed (``1..min_active-1``, or past a cap).

The hull of an item is the upper concave envelope of its allowed points. A hull is given by its
*vertices*, a ``(M+1, N)`` bool table (count 0 is always one), and turned into ``(M, N)`` *unit
slopes*: unit ``j`` (count ``j -> j+1``) carries the slope of the hull segment it lies on. Slopes
are therefore constant along a segment and non-increasing down a column, units past the last
vertex get ``-inf``, and taking every unit whose slope beats a threshold lands on a vertex.

Two ways to get the vertices:

* ``block_vertices``: tables that are concave on ``[a, M]`` (``V_root``, ``V_pref``) have one
  block ``0 -> s`` (``s = first_block``) followed by unit steps.
* ``table_vertices``: any table (e.g. the trajectory objectives ``m V_root(v, m)``, convex for a
  small ``v``): a count is a vertex iff some line through it lies above every allowed point.
"""

from __future__ import annotations

import numpy as np

TOL = 1e-12  # absolute slack on value comparisons (values are O(1) per item, M <= a few dozen)


def first_block(F: np.ndarray, a: int) -> np.ndarray:
    """(N,) size ``s_i`` of the first hull step ``0 -> s_i``: first argmax of ``F(m)/m``, ``m >= a``."""
    M = F.shape[0] - 1
    best = F[a] / a
    s = np.full(F.shape[1], a, dtype=np.int64)
    for m in range(a + 1, M + 1):
        avg = F[m] / m
        better = avg > best  # strict: the finest item on ties
        np.copyto(best, avg, where=better)
        s[better] = m
    return s


def block_vertices(s: np.ndarray, M: int) -> np.ndarray:
    """(M+1, N) hull vertices of "block ``0 -> s`` then unit steps" (``s > M``: only count 0)."""
    m = np.arange(M + 1)[:, None]
    return (m == 0) | (m >= s[None, :])


def table_vertices(F: np.ndarray) -> np.ndarray:
    """(M+1, N) hull vertices of any value table (``-inf`` = not allowed).

    Count ``m`` is a vertex iff it is allowed and the steepest chord leaving it to the right is
    no steeper than the flattest chord arriving from the left (a supporting line exists). Collinear
    points count as vertices. O(M^2) vectorised passes: meant for M up to a few dozen.
    """
    M = F.shape[0] - 1
    left = np.full(F.shape, np.inf)  # min slope of a chord (a -> m), a < m
    right = np.full(F.shape, -np.inf)  # max slope of a chord (m -> b), b > m
    slope = np.empty(F.shape[1])
    with np.errstate(invalid="ignore"):
        for b in range(1, M + 1):
            for a in range(b):
                # A chord from a disallowed a is +inf (neutral in left[b]), one to a disallowed b
                # is -inf (neutral in right[a]), both disallowed NaN (fmin / fmax skip it).
                np.subtract(F[b], F[a], out=slope)
                slope /= b - a
                np.fmin(left[b], slope, out=left[b])
                np.fmax(right[a], slope, out=right[a])
    return np.isfinite(F) & (right <= left)


def vertex_slopes(F: np.ndarray, vertex: np.ndarray) -> np.ndarray:
    """(M, N) unit slopes of the hull through ``vertex``; ``-inf`` past the last vertex.

    Unit ``j`` lies on the segment from the last vertex ``<= j`` to the first vertex ``>= j+1``.
    A forward pass writes each segment's slope on its last unit, a backward pass copies it onto
    the segment's other units. Mathematically non-increasing; a running minimum removes rounding
    wiggles.
    """
    M, n = F.shape[0] - 1, F.shape[1]
    S = np.full((M, n), np.nan)
    lo, f_lo = np.zeros(n, dtype=np.int64), F[0].copy()  # count 0 is always a vertex
    for j in range(M):
        end = vertex[j + 1]
        np.divide(F[j + 1] - f_lo, j + 1 - lo, out=S[j], where=end)
        np.copyto(lo, j + 1, where=end)
        np.copyto(f_lo, F[j + 1], where=end)
    S[M - 1][np.isnan(S[M - 1])] = -np.inf  # past the last vertex
    for j in range(M - 2, -1, -1):
        np.copyto(S[j], S[j + 1], where=np.isnan(S[j]))
    np.minimum.accumulate(S, axis=0, out=S)
    return S
