"""Prospective evaluation of success predictions: Brier, AUC, ECE, reliability curve.

Outcomes may be soft: a node with mean reward ``y`` over ``w`` trajectories counts as ``w*y``
successes and ``w*(1-y)`` failures, all at the node's prediction ``p``. So

* Brier = ``sum w [(p - y)^2 + y(1 - y)] / sum w`` (the mean squared error over trajectories; equal
  to the usual Brier for 0/1 outcomes);
* AUC = P(score of a success > score of a failure), ties counting 1/2, over those weighted pairs
  (scikit-learn's ``roc_auc_score``; NaN when either class is empty);
* ECE = ``sum_b (W_b / W) |mean_y_b - mean_p_b|`` over ``n_bins`` equal-width bins of ``p``.

``evaluate_prospective`` returns plain data, separately for roots and prefixes (and all), for the
model and each baseline; ``metrics_frame`` flattens it into a polars table for tracking.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from sklearn.metrics import roc_auc_score


def _check(p: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    w = np.ones_like(p) if w is None else np.asarray(w, dtype=np.float64)
    if not (p.shape == y.shape == w.shape) or p.ndim != 1:
        raise ValueError(f"shapes differ or not 1-D: p {p.shape}, y {y.shape}, w {w.shape}")
    for name, a in (("predictions", p), ("outcomes", y), ("weights", w)):
        if np.isnan(a).any():
            raise ValueError(f"{name} contain NaN")
    return p, y, w


def brier(p, y, w=None) -> float:
    p, y, w = _check(p, y, w)
    return float(np.sum(w * ((p - y) ** 2 + y * (1 - y))) / np.sum(w)) if np.sum(w) > 0 else float("nan")


def auc(p, y, w=None) -> float:
    """Weighted ROC AUC with soft labels (scikit-learn on the expanded pairs); ties in ``p`` count 1/2."""
    p, y, w = _check(p, y, w)
    pos, neg = w * y, w * (1 - y)
    if pos.sum() <= 0 or neg.sum() <= 0:
        return float("nan")
    keep = np.r_[pos, neg] > 0
    labels = np.r_[np.ones_like(p), np.zeros_like(p)][keep]
    return float(roc_auc_score(labels, np.r_[p, p][keep], sample_weight=np.r_[pos, neg][keep]))


def reliability(p, y, w=None, n_bins: int = 10) -> list[dict]:
    """Non-empty equal-width bins: ``{lo, hi, mean_pred, mean_outcome, weight, count}``."""
    p, y, w = _check(p, y, w)
    b = np.minimum((p * n_bins).astype(int), n_bins - 1)
    out = []
    for k in range(n_bins):
        m = (b == k) & (w > 0)
        if not m.any():
            continue
        wk = w[m].sum()
        out.append(
            {
                "lo": k / n_bins,
                "hi": (k + 1) / n_bins,
                "mean_pred": float(np.sum(w[m] * p[m]) / wk),
                "mean_outcome": float(np.sum(w[m] * y[m]) / wk),
                "weight": float(wk),
                "count": int(m.sum()),
            }
        )
    return out


def ece(p, y, w=None, n_bins: int = 10) -> float:
    bins = reliability(p, y, w, n_bins)
    total = sum(b["weight"] for b in bins)
    if total <= 0:
        return float("nan")
    return float(sum(b["weight"] * abs(b["mean_outcome"] - b["mean_pred"]) for b in bins) / total)


def score(p, y, w=None, n_bins: int = 10) -> dict:
    """``{brier, auc, ece, mean_pred, mean_outcome, reliability}`` for one predictor on one subset."""
    p, y, w = _check(p, y, w)
    wsum = np.sum(w)
    return {
        "brier": brier(p, y, w),
        "auc": auc(p, y, w),
        "ece": ece(p, y, w, n_bins),
        "mean_pred": float(np.sum(w * p) / wsum) if wsum > 0 else float("nan"),
        "mean_outcome": float(np.sum(w * y) / wsum) if wsum > 0 else float("nan"),
        "reliability": reliability(p, y, w, n_bins),
    }


def _kinds(kind) -> np.ndarray:
    """``kind`` as 'root' / 'prefix' strings: accepts strings or a boolean is-root array."""
    k = np.asarray(kind)
    if k.dtype == bool:
        return np.where(k, "root", "prefix")
    bad = set(np.unique(k).tolist()) - {"root", "prefix"}
    if bad:
        raise ValueError(f"kind must be 'root' or 'prefix' (or a boolean is-root array); got {sorted(bad)}")
    return k.astype(str)


def evaluate_prospective(
    pred_before: np.ndarray,
    outcomes: np.ndarray,
    weights: np.ndarray | None,
    kind,
    *,
    baselines: dict[str, np.ndarray] | None = None,
    n_bins: int = 10,
) -> dict:
    """Score predictions made *before* the outcomes, per node kind, next to the baselines.

    Args: ``pred_before``, ``outcomes`` (soft, in [0, 1]), ``weights`` (trajectory counts; None =
    1) and ``kind`` ('root'/'prefix' strings or a boolean is-root array), all ``(n,)``;
    ``baselines`` maps a name (e.g. ``constant``, ``history``) to predictions ``(n,)`` made at the
    same time. Without a ``constant`` baseline, the in-sample weighted mean outcome per subset is
    used and ``constant_source`` says so.

    Returns ``{subset: {"n", "weight", predictor: score(...)}}`` for subset in root, prefix, all
    (subsets with no nodes are left out), plus ``"constant_source"``.
    """
    p, y, w = _check(pred_before, outcomes, weights)
    k = _kinds(kind)
    if k.shape != p.shape:
        raise ValueError(f"kind has shape {k.shape}, predictions {p.shape}")
    preds = {"model": p} | {name: _check(b, y, w)[0] for name, b in (baselines or {}).items()}
    out: dict = {"constant_source": "baseline" if "constant" in preds else "in_sample"}
    for subset, mask in (("root", k == "root"), ("prefix", k == "prefix"), ("all", np.ones_like(p, bool))):
        if not mask.any():
            continue
        ys, ws = y[mask], w[mask]
        entry: dict = {"n": int(mask.sum()), "weight": float(ws.sum())}
        for name, pr in preds.items():
            entry[name] = score(pr[mask], ys, ws, n_bins)
        if "constant" not in preds:
            mean = float(np.sum(ws * ys) / ws.sum()) if ws.sum() > 0 else 0.5
            entry["constant"] = score(np.full(mask.sum(), mean), ys, ws, n_bins)
        out[subset] = entry
    return out


def metrics_frame(result: dict, **tags) -> pl.DataFrame:
    """Flatten ``evaluate_prospective`` output into rows ``(tags..., subset, predictor, metric, value)``."""
    rows = []
    for subset, entry in result.items():
        if not isinstance(entry, dict):
            continue
        for name, sc in entry.items():
            if not isinstance(sc, dict):
                continue
            for metric in ("brier", "auc", "ece", "mean_pred", "mean_outcome"):
                rows.append(
                    {**tags, "subset": subset, "predictor": name, "metric": metric, "value": sc[metric]}
                )
    return pl.DataFrame(rows)
