"""Calibration maps fitted on a held-out split: Platt scaling and isotonic regression.

Each fitter takes raw probabilities ``p`` ``(n,)``, soft outcomes ``y`` ``(n,)`` in [0, 1], weights
``w`` ``(n,)`` and optionally iterations ``t`` ``(n,)``, and returns a picklable map
``(p (n,), t (n,) | None) -> (n,)``. Only Platt uses ``t`` (a per-iteration drift term). Registered by name in ``CALIBRATORS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_EPS = 1e-6


@dataclass(frozen=True)
class PlattMap:
    a: float
    b: float
    c: float = 0.0  # logit drift per iteration
    t_ref: float = 0.0  # last iteration of the calibration data

    def __call__(self, p: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
        z = self.a * logit(np.asarray(p, dtype=np.float64)) + self.b
        if t is not None and self.c != 0.0:
            # at most one step ahead: the drift is a local trend, not a forecast
            z = z + self.c * np.clip(np.asarray(t, dtype=np.float64) - self.t_ref, None, 1.0)
        return sigmoid(z)


@dataclass(frozen=True)
class IsotonicMap:
    centres: np.ndarray  # (k,) increasing block centres of the raw probabilities
    levels: np.ndarray  # (k,) non-decreasing calibrated values

    def __call__(self, p: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
        return np.interp(np.asarray(p, dtype=np.float64), self.centres, self.levels)


@dataclass(frozen=True)
class IdentityMap:
    def __call__(self, p: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
        return np.asarray(p, dtype=np.float64)


Calibrator = PlattMap | IsotonicMap | IdentityMap


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free


def fit_platt(
    p: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    t: np.ndarray | None = None,
    *,
    iters: int = 50,
    l2: float = 1e-2,
) -> PlattMap:
    """``q = sigmoid(a * logit(p) + b + c * (t - t_ref))``, by weighted Newton on the log-loss (small ridge).

    ``t`` ``(n,)`` (optional) is each node's iteration: ``c`` is the drift of the outcomes' logit per
    iteration that the model (which does not see the iteration) misses, so predictions for the next
    iteration are extrapolated one step along it instead of lagging behind an improving policy.
    """
    z = logit(p)
    trend = t is not None and len(np.unique(t)) > 1
    t_ref = float(np.max(t)) if t is not None and len(t) else 0.0
    cols = [z, np.ones_like(z)] + ([np.asarray(t, dtype=np.float64) - t_ref] if trend else [])
    x = np.stack(cols, axis=1)
    anchor = np.array([1.0, 0.0, 0.0][: x.shape[1]])
    theta = anchor.copy()

    def loss(th: np.ndarray) -> float:
        s = x @ th  # log-loss in logit form: log(1 + e^s) - y s, overflow-free
        return float(np.sum(w * (np.logaddexp(0.0, s) - y * s)) + 0.5 * l2 * np.sum((th - anchor) ** 2))

    cur = loss(theta)
    for _ in range(iters):
        q = sigmoid(x @ theta)
        grad = x.T @ (w * (q - y)) + l2 * (theta - anchor)
        hess = (x * (w * q * (1 - q))[:, None]).T @ x + l2 * np.eye(len(theta))
        step = np.linalg.solve(hess, grad)
        # backtracking: raw Newton diverges from overconfident inputs (flat sigmoid, tiny Hessian)
        for _ in range(30):
            new = loss(theta - step)
            if new <= cur:
                break
            step = step / 2
        theta, cur = theta - step, min(new, cur)
        if np.abs(step).max() < 1e-8:
            break
    c = float(theta[2]) if trend else 0.0
    return PlattMap(float(theta[0]), float(theta[1]), c, t_ref)


def fit_isotonic(p: np.ndarray, y: np.ndarray, w: np.ndarray, t: np.ndarray | None = None) -> IsotonicMap:
    """Weighted pool-adjacent-violators on ``p`` order; linear interpolation between block centres."""
    order = np.argsort(p, kind="stable")
    xs, ys, ws = p[order], y[order], np.maximum(w[order], 1e-12)
    # blocks as stacks of (sum_wy, sum_w, sum_wx)
    swy, sw, swx = [], [], []
    for xi, yi, wi in zip(xs, ys, ws, strict=True):
        swy.append(wi * yi)
        sw.append(wi)
        swx.append(wi * xi)
        while len(sw) > 1 and swy[-2] / sw[-2] >= swy[-1] / sw[-1]:
            b_wy, b_w, b_wx = swy.pop(), sw.pop(), swx.pop()
            swy[-1] += b_wy
            sw[-1] += b_w
            swx[-1] += b_wx
    centres = np.array(swx) / np.array(sw)
    levels = np.array(swy) / np.array(sw)
    # keep predictions off exact 0/1: a held-out block of all-failures is not proof of certainty
    levels = np.clip(levels, 1e-3, 1 - 1e-3)
    return IsotonicMap(centres, levels)


def identity(p: np.ndarray, y: np.ndarray, w: np.ndarray, t: np.ndarray | None = None) -> IdentityMap:
    return IdentityMap()


CALIBRATORS: dict[str, Callable[..., Calibrator]] = {
    "platt": fit_platt,
    "isotonic": fit_isotonic,
    "none": identity,
}
