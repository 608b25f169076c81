"""Calibration maps fitted on a held-out split: Platt scaling and isotonic regression.

Each fitter takes raw probabilities ``p`` ``(n,)``, soft outcomes ``y`` ``(n,)`` in [0, 1] and weights
``w`` ``(n,)`` and returns a picklable map ``(n,) -> (n,)``. Registered by name in ``CALIBRATORS``.
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

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return sigmoid(self.a * logit(np.asarray(p, dtype=np.float64)) + self.b)


@dataclass(frozen=True)
class IsotonicMap:
    centres: np.ndarray  # (k,) increasing block centres of the raw probabilities
    levels: np.ndarray  # (k,) non-decreasing calibrated values

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(p, dtype=np.float64), self.centres, self.levels)


@dataclass(frozen=True)
class IdentityMap:
    def __call__(self, p: np.ndarray) -> np.ndarray:
        return np.asarray(p, dtype=np.float64)


Calibrator = PlattMap | IsotonicMap | IdentityMap


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free


def fit_platt(p: np.ndarray, y: np.ndarray, w: np.ndarray, *, iters: int = 50, l2: float = 1e-3) -> Calibrator:
    """``q = sigmoid(a * logit(p) + b)``, (a, b) by weighted Newton on the log-loss (tiny ridge)."""
    z = logit(p)
    theta = np.array([1.0, 0.0])
    x = np.stack([z, np.ones_like(z)], axis=1)
    for _ in range(iters):
        q = sigmoid(x @ theta)
        grad = x.T @ (w * (q - y)) + l2 * (theta - [1.0, 0.0])
        hess = (x * (w * q * (1 - q))[:, None]).T @ x + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta = theta - step
        if np.abs(step).max() < 1e-8:
            break
    return PlattMap(float(theta[0]), float(theta[1]))


def fit_isotonic(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> Calibrator:
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


def identity(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> Calibrator:
    return IdentityMap()


CALIBRATORS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], Calibrator]] = {
    "platt": fit_platt,
    "isotonic": fit_isotonic,
    "none": identity,
}
