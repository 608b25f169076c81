"""Calibration maps (scikit-learn), fitted per node kind on held-out predictions.

* ``fit_platt``: logistic regression of the outcome on ``logit(p)`` (two parameters);
* ``fit_isotonic``: weighted isotonic regression, clipped off exact 0 / 1;
* ``IdentityMap``: no calibration (too little data, or ``method: none``).

Each fitter takes raw probabilities ``p``, soft outcomes ``y`` in [0, 1] and weights ``w`` (all
``(n,)``) and returns a map ``p (n,) -> (n,)``. Soft outcomes are fitted as two weighted rows per
node (``w*y`` successes, ``w*(1-y)`` failures). Maps are plain data: ``to_state()`` is JSON and
``map_from_state`` rebuilds one (nothing is pickled). There is no drift term: a trend over
iterations is what the prior's discounting and the head's as-of offsets already follow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

_EPS = 1e-6
LEVEL_CLIP = 1e-3  # a held-out block of all-failures is not proof of certainty
#: The track record a final map is fitted on: prospective predictions ``p`` of a kind with outcome ``y``, weight ``w``.
TRACK_SCHEMA = {"kind": pl.Utf8, "iteration": pl.Int64, "p": pl.Float64, "y": pl.Float64, "w": pl.Float64}


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))  # overflow-free


@dataclass(frozen=True)
class PlattMap:
    a: float
    b: float

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return sigmoid(self.a * logit(p) + self.b)

    def to_state(self) -> dict:
        return {"method": "platt", "a": self.a, "b": self.b}


@dataclass(frozen=True)
class IsotonicMap:
    x: tuple[float, ...]  # increasing thresholds of the raw probabilities
    y: tuple[float, ...]  # non-decreasing calibrated values

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(p, dtype=np.float64), self.x, self.y)

    def to_state(self) -> dict:
        return {"method": "isotonic", "x": list(self.x), "y": list(self.y)}


@dataclass(frozen=True)
class IdentityMap:
    def __call__(self, p: np.ndarray) -> np.ndarray:
        return np.asarray(p, dtype=np.float64)

    def to_state(self) -> dict:
        return {"method": "none"}


Calibrator = PlattMap | IsotonicMap | IdentityMap


def _expand(p, y, w):
    p, y, w = (np.asarray(a, dtype=np.float64) for a in (p, y, w))
    x = np.r_[p, p]
    yy = np.r_[np.ones_like(p), np.zeros_like(p)]
    ww = np.r_[w * y, w * (1 - y)]
    keep = ww > 0
    return x[keep], yy[keep], ww[keep]


def fit_platt(p: np.ndarray, y: np.ndarray, w: np.ndarray, *, c: float = 100.0) -> Calibrator:
    """``q = sigmoid(a * logit(p) + b)`` by weighted logistic regression (weak L2, ``C = c``)."""
    x, yy, ww = _expand(p, y, w)
    if len(np.unique(yy)) < 2:
        return IdentityMap()
    lr = LogisticRegression(C=c, max_iter=200).fit(logit(x)[:, None], yy, sample_weight=ww)
    return PlattMap(float(lr.coef_[0, 0]), float(lr.intercept_[0]))


def fit_isotonic(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> Calibrator:
    """Weighted isotonic regression on ``p`` (increasing), linear between thresholds."""
    x, yy, ww = _expand(p, y, w)
    if len(np.unique(yy)) < 2:
        return IdentityMap()
    iso = IsotonicRegression(y_min=LEVEL_CLIP, y_max=1 - LEVEL_CLIP, out_of_bounds="clip").fit(x, yy, sample_weight=ww)
    return IsotonicMap(tuple(iso.X_thresholds_.tolist()), tuple(iso.y_thresholds_.tolist()))


def identity(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> Calibrator:
    return IdentityMap()


CALIBRATORS = {"platt": fit_platt, "isotonic": fit_isotonic, "none": identity}


def brier(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Against the trajectories' 0/1 outcomes: ``(p - y)^2 + y(1 - y)`` per node, weighted."""
    return float(np.sum(w * ((p - y) ** 2 + y * (1 - y))) / max(np.sum(w), 1e-12))


def fit_map(method: str, p, y, w, *, min_isotonic_nodes: int) -> tuple[dict, Calibrator]:
    """One map and its report ``{n, method, brier_before, brier_after}`` (in-sample); isotonic falls
    back to Platt below ``min_isotonic_nodes``."""
    if method == "isotonic" and len(p) < min_isotonic_nodes:
        method = "platt"
    cal = CALIBRATORS[method](p, y, w)
    return {"n": float(len(p)), "method": cal.to_state()["method"], "brier_before": brier(p, y, w),
            "brier_after": brier(cal(p), y, w)}, cal  # fmt: skip


def by_kind(maps: dict[str, Calibrator], p: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """``maps['root']`` on the root rows of ``p`` ``(n,)``, ``maps['prefix']`` on the others."""
    return np.where(roots, maps["root"](p), maps["prefix"](p)) if len(p) else np.zeros(0)


def map_from_state(state: dict) -> Calibrator:
    method = state.get("method")
    if method == "platt":
        return PlattMap(float(state["a"]), float(state["b"]))
    if method == "isotonic":
        return IsotonicMap(tuple(map(float, state["x"])), tuple(map(float, state["y"])))
    if method == "none":
        return IdentityMap()
    raise ValueError(f"unknown calibration map {method!r}; known: {sorted(CALIBRATORS)}")
