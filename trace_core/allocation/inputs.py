"""Input checks shared by the solvers: every bad argument raises ``ValueError`` naming it."""

from __future__ import annotations

import numpy as np

from trace_core.allocation.config import OBJECTIVES


def check_probabilities(name: str, x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {a.shape}")
    bad = ~np.isfinite(a) | (a < 0.0) | (a > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must hold finite values in [0, 1]; {name}[{i}] = {a[i]!r}")
    return a


def check_budget(value, integral: bool) -> float:
    b = float(value)
    if not np.isfinite(b) or b < 0:
        raise ValueError(f"budget must be a finite number >= 0, got {value!r}")
    return float(np.floor(b)) if integral else b


def check_costs(cost, n: int) -> np.ndarray:
    c = np.asarray(cost, dtype=np.float64)
    if c.ndim == 0:
        c = np.broadcast_to(c, (n,))
    if c.shape != (n,):
        raise ValueError(f"cost must be a scalar or have shape ({n},), got shape {c.shape}")
    if not (np.isfinite(c).all() and (c > 0).all()):
        raise ValueError("cost must hold finite values > 0")
    return c


def check_positive_int(name: str, x, lo: int = 1) -> int:
    if int(x) != x or x < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {x!r}")
    return int(x)


def check_objective(x) -> str:
    if x not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(map(repr, OBJECTIVES))}, got {x!r}")
    return str(x)


def check_min_gain(x) -> float:
    g = float(x)
    if not np.isfinite(g) or g < 0:
        raise ValueError(f"min_gain must be a finite number >= 0, got {x!r}")
    return g
