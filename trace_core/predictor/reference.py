"""The reference term of a root's prediction: how its demonstration ranks under the policy.

A root row may carry ``ref_score`` (``stages.reference``: the within-cell rank in [-0.5, 0.5] of
the policy's log-probability of the task's worked solution). The term moves the mapped prior's
logit by ``a_g + b_g * ref_score``, with one intercept and slope per group ``g`` = (family, whether
the prompt has a record of its own as of the row's iteration): a prompt never sampled has only its
cell and this score to go by, a prompt with a record already carries much of what the score says.

The coefficients are a weighted logistic regression with the mapped prior's logit as offset, on
the labelled roots that carry a score (the same rows and weights as the prior's map), L2-penalised
and fitted by Newton's method (two parameters a term: a few milliseconds). A pooled term per kind
(every family together) is penalised toward "no correction"; each family's term toward its
kind's pool (``ReferenceTerm``). The prior of a past root is taken as of its iteration, so every
fitting row is a prospective prediction, as for the prior's map. A row without a score (a prefix,
a task without a demonstration) is left as it is.
"""

from __future__ import annotations

import numpy as np

from trace_core.predictor.calibration import sigmoid


def group_keys(families, seen: np.ndarray) -> np.ndarray:
    """``(n,)`` group names: ``'<family>:seen'`` or ``'<family>:unseen'``."""
    return np.asarray([f"{f}:{'seen' if s else 'unseen'}" for f, s in zip(families, seen, strict=True)], dtype=object)


def _newton(x: np.ndarray, z: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float, center=(0.0, 0.0),
            steps: int = 25) -> tuple[float, float]:
    """argmin over (a, b) of the weighted logistic loss of ``y`` at logit ``z + a + b x`` plus
    ``l2/2 |(a, b) - center|^2``."""
    c = np.asarray(center, dtype=np.float64)
    theta = c.copy()
    design = np.stack([np.ones_like(x), x], axis=1)
    for _ in range(steps):
        p = sigmoid(z + design @ theta)
        grad = design.T @ (w * (p - y)) + l2 * (theta - c)
        hess = (design * (w * p * (1 - p))[:, None]).T @ design + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(theta[0]), float(theta[1])


def _kind(group: str) -> str:
    return "pool:" + group.rsplit(":", 1)[-1]


class ReferenceTerm:
    """``coefs[group] = (a, b)``; ``apply`` adds ``a + b * score`` to the logit of scored rows.

    Two levels: a pooled term per kind (``pool:seen``, ``pool:unseen``: every family together),
    fitted once it has ``min_nodes`` rows, and a term per group shrunk toward its kind's pool
    (``group_l2``), so a family with few scored roots yet -- the unseen prompts of the first
    iterations, which is when most unseen prompts are picked -- borrows the other families'
    slope instead of getting none. A group with no pool needs ``min_nodes`` rows of its own."""

    def __init__(self, coefs: dict[str, tuple[float, float]] | None = None):
        self.coefs = dict(coefs or {})

    def fit(self, score: np.ndarray, z: np.ndarray, y: np.ndarray, w: np.ndarray, groups: np.ndarray, *,
            l2: float, min_nodes: int, group_l2: float | None = None) -> dict:
        """Refit every level from scratch; the report has each fitted term's rows and coefficients."""
        self.coefs, report = {}, {}
        ok = np.isfinite(score) & np.isfinite(z) & (w > 0)
        kinds = np.asarray([_kind(str(g)) for g in groups], dtype=object)
        for k in sorted(set(kinds[ok].tolist())):
            m = ok & (kinds == k)
            if m.sum() >= min_nodes:
                self.coefs[k] = _newton(score[m], z[m], y[m], w[m], l2)
                report[k] = {"n": float(m.sum()), "a": round(self.coefs[k][0], 4), "b": round(self.coefs[k][1], 4)}
        for g in sorted(set(groups[ok].tolist())):
            m = ok & (groups == g)
            pool = self.coefs.get(_kind(g))
            if pool is None and m.sum() < min_nodes:
                report[g] = {"n": float(m.sum()), "method": "skipped"}
                continue
            if pool is None:
                a, b = _newton(score[m], z[m], y[m], w[m], l2)
            else:
                a, b = _newton(score[m], z[m], y[m], w[m], l2 if group_l2 is None else group_l2, center=pool)
            self.coefs[g] = (a, b)
            report[g] = {"n": float(m.sum()), "a": round(a, 4), "b": round(b, 4)}
        return report

    def apply(self, z: np.ndarray, score: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """``z`` moved by each scored row's term: its group's, else its kind's pool (rows without a
        score, or without either term, unchanged)."""
        out = np.asarray(z, dtype=np.float64).copy()
        scored = np.isfinite(score)
        for g in set(np.asarray(groups)[scored].tolist()):
            coef = self.coefs.get(g) or self.coefs.get(_kind(g))
            if coef is None:
                continue
            m = scored & (groups == g)
            out[m] += coef[0] + coef[1] * score[m]
        return out

    def state(self) -> dict:
        return {"coefs": {g: [a, b] for g, (a, b) in self.coefs.items()}}

    @classmethod
    def from_state(cls, state: dict | None) -> ReferenceTerm:
        return cls({g: (float(a), float(b)) for g, (a, b) in ((state or {}).get("coefs") or {}).items()})
