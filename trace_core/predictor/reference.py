"""The reference term of a root's prediction: how its demonstration ranks under the policy.

A root row may carry ``ref_score`` (``stages.reference``: the within-cell rank in [-0.5, 0.5] of
the policy's log-probability of the task's worked solution). The term moves the mapped prior's
logit by ``a_g + b_g * ref_score``, with one intercept and slope per group ``g`` = (family, whether
the prompt has a record of its own as of the row's iteration): a prompt never sampled has only its
cell and this score to go by, a prompt with a record already carries much of what the score says.

The coefficients are a weighted logistic regression with the mapped prior's logit as offset, on
the labelled roots that carry a score (the same rows and weights as the prior's map), L2-penalised
toward "no correction" and fitted by Newton's method (two parameters a group: a few milliseconds).
The prior of a past root is taken as of its iteration, so every fitting row is a prospective
prediction, as for the prior's map. A group with fewer than ``min_nodes`` rows gets no term; a row
without a score (a prefix, a task without a demonstration) is left as it is.
"""

from __future__ import annotations

import numpy as np

from trace_core.predictor.calibration import sigmoid


def group_keys(families, seen: np.ndarray) -> np.ndarray:
    """``(n,)`` group names: ``'<family>:seen'`` or ``'<family>:unseen'``."""
    return np.asarray([f"{f}:{'seen' if s else 'unseen'}" for f, s in zip(families, seen, strict=True)], dtype=object)


def _newton(x: np.ndarray, z: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float, steps: int = 25) -> tuple[float, float]:
    """argmin over (a, b) of the weighted logistic loss of ``y`` at logit ``z + a + b x`` plus ``l2/2 (a^2 + b^2)``."""
    theta = np.zeros(2)
    design = np.stack([np.ones_like(x), x], axis=1)
    for _ in range(steps):
        p = sigmoid(z + design @ theta)
        grad = design.T @ (w * (p - y)) + l2 * theta
        hess = (design * (w * p * (1 - p))[:, None]).T @ design + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(theta[0]), float(theta[1])


class ReferenceTerm:
    """``coefs[group] = (a, b)``; ``apply`` adds ``a + b * score`` to the logit of scored rows."""

    def __init__(self, coefs: dict[str, tuple[float, float]] | None = None):
        self.coefs = dict(coefs or {})

    def fit(self, score: np.ndarray, z: np.ndarray, y: np.ndarray, w: np.ndarray, groups: np.ndarray, *,
            l2: float, min_nodes: int) -> dict:
        """Refit every group from scratch; the report has each group's rows and coefficients."""
        self.coefs, report = {}, {}
        ok = np.isfinite(score) & np.isfinite(z) & (w > 0)
        for g in sorted(set(groups[ok].tolist())):
            m = ok & (groups == g)
            if m.sum() < min_nodes:
                report[g] = {"n": float(m.sum()), "method": "skipped"}
                continue
            a, b = _newton(score[m], z[m], y[m], w[m], l2)
            self.coefs[g] = (a, b)
            report[g] = {"n": float(m.sum()), "a": round(a, 4), "b": round(b, 4)}
        return report

    def apply(self, z: np.ndarray, score: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """``z`` moved by each scored row's group term (rows without a score or a term unchanged)."""
        out = np.asarray(z, dtype=np.float64).copy()
        for g, (a, b) in self.coefs.items():
            m = (groups == g) & np.isfinite(score)
            out[m] += a + b * score[m]
        return out

    def state(self) -> dict:
        return {"coefs": {g: [a, b] for g, (a, b) in self.coefs.items()}}

    @classmethod
    def from_state(cls, state: dict | None) -> ReferenceTerm:
        return cls({g: (float(a), float(b)) for g, (a, b) in ((state or {}).get("coefs") or {}).items()})
