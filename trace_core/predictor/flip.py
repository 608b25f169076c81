"""Continuation flips: P(a continuation from a prefix gets a reward different from the raw ``r``).

A prefix allocation's value hinges on this probability (``V_pref = 1 - (1 - flip)^k``). The paper
writes it ``r(1-V) + (1-r)V`` with the prefix's success probability ``V``; but ``V`` ignores which
way the raw trajectory went, and failed trajectories rarely flip past the first turns while
successful ones keep flipping. So, in three layers, each used once there is data for it:

1. ``flip0 = V`` if ``r = 0`` else ``1 - V``, with ``V`` the prior's success probability of the prefix
   (its prompt and cell, plus its sibling rollouts of the same iteration: ``HierarchicalPrior``);
2. a logit shift per bin of ``(r, min(depth, 3))``: the observed flip rate of the stored
   continuations in the bin, shrunk toward the bin's mean ``flip0`` with ``strength`` pseudo-counts
   (no continuations yet: no shift);
3. with ``min_continuations`` or more continuation outcomes, a scikit-learn logistic regression on
   the shifted logit, ``r``, depth, the turns the raw trajectory took after the prefix
   (``remaining``) and tool errors, each split by ``r``.

Training pairs come from the node table: a continuation is a trajectory of ``origin ==
'extension'``; its first node's ``parent_id`` is the branch prefix (a raw node), and ``r`` is the
reward of the raw leaf on that prefix's ``trajectory_id``.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from sklearn.linear_model import LogisticRegression

from trace_core.predictor.calibration import logit, sigmoid
from trace_core.predictor.config import FlipConfig

MAX_DEPTH_BIN = 3


def raw_turns(nodes: pl.DataFrame) -> pl.DataFrame:
    """``(trajectory_id, r, leaf_depth)`` of every raw leaf in ``nodes``."""
    return nodes.filter(pl.col("is_leaf").fill_null(False) & (pl.col("origin") == "raw")).select(
        "trajectory_id", (pl.col("reward").cast(pl.Float64) > 0.5).cast(pl.Float64).alias("r"),
        pl.col("depth").alias("leaf_depth")).unique("trajectory_id")  # fmt: skip


def with_remaining(prefixes: pl.DataFrame, nodes: pl.DataFrame | None = None) -> pl.DataFrame:
    """``prefixes`` plus ``remaining``: turns of the raw trajectory after the prefix (kept when the
    column is given; from the raw leaf of the same ``trajectory_id`` in ``nodes``, else 1)."""
    if "remaining" in prefixes.columns:
        return prefixes.with_columns(pl.col("remaining").cast(pl.Float64).fill_null(1.0))
    src = raw_turns(nodes if nodes is not None else prefixes).select("trajectory_id", "leaf_depth")
    return (prefixes.with_row_index("_row").join(src, on="trajectory_id", how="left").sort("_row")
            .with_columns((pl.col("leaf_depth") - pl.col("depth")).cast(pl.Float64).clip(1.0, None)
                          .fill_null(1.0).alias("remaining")).drop("leaf_depth", "_row"))  # fmt: skip


def continuation_pairs(nodes: pl.DataFrame) -> pl.DataFrame:
    """One row per branch prefix with continuations: ``node_id, r, n`` (continuations), ``f`` (flips)."""
    ext = nodes.filter(pl.col("origin") == "extension")
    if ext.height == 0:
        return pl.DataFrame(schema={"node_id": pl.Utf8, "r": pl.Float64, "n": pl.Float64, "f": pl.Float64})
    first = ext.sort("depth").group_by("trajectory_id").agg(pl.col("parent_id").first().alias("node_id"))
    leaf = ext.filter(pl.col("is_leaf").fill_null(False) & pl.col("reward").is_not_null()).select(
        "trajectory_id", (pl.col("reward").cast(pl.Float64) > 0.5).cast(pl.Float64).alias("y"))
    branch = nodes.select("node_id", pl.col("trajectory_id").alias("b_traj"))
    r = raw_turns(nodes).select(pl.col("trajectory_id").alias("b_traj"), "r")
    return (first.join(leaf, on="trajectory_id").join(branch, on="node_id").join(r, on="b_traj")
            .group_by("node_id").agg(pl.col("r").first(), pl.len().cast(pl.Float64).alias("n"),
                                     (pl.col("y") != pl.col("r")).cast(pl.Float64).sum().alias("f"))
            .sort("node_id"))  # fmt: skip  (group_by order varies run to run)


def _bins(r: np.ndarray, depth: np.ndarray) -> np.ndarray:
    return (r > 0.5).astype(int) * (MAX_DEPTH_BIN + 1) + np.clip(depth, 0, MAX_DEPTH_BIN).astype(int)


def _x(z: np.ndarray, r: np.ndarray, depth: np.ndarray, remaining: np.ndarray, errors: np.ndarray) -> np.ndarray:
    r = (r > 0.5).astype(float)
    lrem, d, err = np.log1p(remaining), np.minimum(depth, 8.0), (errors > 0).astype(float)
    return np.stack([z, r, r * lrem, (1 - r) * lrem, r * d, (1 - r) * d, err], axis=1)


class FlipModel:
    """See the module docstring; ``fit`` on pair features, ``predict`` on prefix features."""

    def __init__(self, cfg: FlipConfig):
        self.cfg = cfg
        self._reset()

    def _reset(self) -> None:
        self.shift = np.zeros(2 * (MAX_DEPTH_BIN + 1))  # logit shift per (r, depth) bin
        self.bin_counts = np.zeros_like(self.shift)
        self.coef: np.ndarray | None = None  # logistic layer, when fitted
        self.intercept = 0.0
        self.n_continuations = 0.0

    @staticmethod
    def flip0(v: np.ndarray, r: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        return np.where(np.asarray(r) > 0.5, 1.0 - v, v)

    def _shifted(self, v, r, depth) -> np.ndarray:
        return logit(self.flip0(v, r)) + self.shift[_bins(r, depth)]

    def fit(self, v, r, depth, remaining, errors, n, f, w) -> dict:
        """Arrays ``(m,)`` per branch prefix: prior success ``v``, raw reward ``r``, ``depth``,
        ``remaining`` turns, tool ``errors``, continuations ``n``, flips ``f`` and age weight ``w``."""
        v, r, depth, remaining, errors, n, f, w = (np.asarray(a, dtype=np.float64)
                                                  for a in (v, r, depth, remaining, errors, n, f, w))  # fmt: skip
        self._reset()
        self.n_continuations = float(n.sum())
        if len(n) == 0:
            return {"continuations": 0.0, "logistic": False}
        b, p0 = _bins(r, depth), self.flip0(v, r)
        for k in np.unique(b):
            m = b == k
            nn_, ff = float(np.sum(w[m] * n[m])), float(np.sum(w[m] * f[m]))
            mean0 = float(np.clip(np.sum(w[m] * n[m] * p0[m]) / max(nn_, 1e-12), 1e-3, 1 - 1e-3))
            post = (self.cfg.strength * mean0 + ff) / (self.cfg.strength + nn_)
            self.shift[k] = float(logit(np.clip(post, 1e-3, 1 - 1e-3)) - logit(mean0))
            self.bin_counts[k] = nn_
        if self.n_continuations >= self.cfg.min_continuations and 0 < f.sum() < n.sum():
            x = _x(self._shifted(v, r, depth), r, depth, remaining, errors)
            xx, yy = np.concatenate([x, x]), np.r_[np.ones(len(n)), np.zeros(len(n))]
            ww = np.r_[w * f, w * (n - f)]
            keep = ww > 0
            lr = LogisticRegression(C=self.cfg.c, max_iter=500).fit(xx[keep], yy[keep], sample_weight=ww[keep])
            self.coef, self.intercept = lr.coef_[0].astype(np.float64), float(lr.intercept_[0])
        return {"continuations": self.n_continuations, "logistic": self.coef is not None}

    def predict(self, v, r, depth, remaining, errors) -> np.ndarray:
        """Flip probability ``(n,)`` in (0, 1)."""
        v, r, depth, remaining, errors = (np.asarray(a, dtype=np.float64) for a in (v, r, depth, remaining, errors))
        z = self._shifted(v, r, depth)
        if self.coef is not None:
            z = _x(z, r, depth, remaining, errors) @ self.coef + self.intercept
        return np.clip(sigmoid(z), 1e-4, 1 - 1e-4)

    def state(self) -> dict:
        return {"shift": self.shift.tolist(), "bin_counts": self.bin_counts.tolist(),
                "coef": None if self.coef is None else self.coef.tolist(), "intercept": self.intercept,
                "n_continuations": self.n_continuations}  # fmt: skip

    @classmethod
    def from_state(cls, cfg: FlipConfig, state: dict) -> FlipModel:
        model = cls(cfg)
        model.shift = np.asarray(state["shift"], dtype=np.float64)
        model.bin_counts = np.asarray(state["bin_counts"], dtype=np.float64)
        model.coef = None if state["coef"] is None else np.asarray(state["coef"], dtype=np.float64)
        model.intercept, model.n_continuations = float(state["intercept"]), float(state["n_continuations"])
        return model
