"""The default CPU-fast predictor: hierarchical prior -> torch head (a correction to the prior's
logit) -> per-kind calibration; plus the continuation flip model.

Registered as ``hashed_mlp`` (``model.hidden`` as configured, default 16) and ``hashed_logistic``
(``hidden = 0``).

``fit(nodes, *, cell_prior=None)`` with every labelled node so far:

1. prior: outcome counts per (prompt, iteration) of the raw rollouts, plus ``cell_prior`` (the
   held-out evaluation's outcomes per (family, difficulty), measured before training; kept for
   later refreshes) -> ``HierarchicalPrior`` with empirical-Bayes strengths. This is what makes
   iteration 0 not blind and a cell solved every time predicted near 1 after one iteration;
2. training rows: labelled roots and raw non-leaf prefixes (what is scored at decision time), whole
   iterations newest first up to ``max_train_nodes``; weight ``min(subtree_count,
   max_label_weight) * recency_discount ** age``. A row's offset is the prior's logit *as of its
   own iteration* (plus, for a prefix, its finished sibling rollouts), so the head learns what the
   prior misses one iteration ahead, not the outcome it was told;
3. calibration per kind, only with ``calibration.min_nodes`` held-out nodes of that kind: a cold
   head on the prompts outside a seeded ``holdout_fraction``, the map (Platt or isotonic,
   scikit-learn) fitted on the held-out prompts' predictions; otherwise that kind is left as is;
4. the head trains on all rows for a number of optimiser steps (``model.schedule``), warm-started
   from the previous fit when the layout is unchanged;
5. the flip model on the stored continuations (``flip``).

``predict``: prior as of the row's iteration (null = one past the fit) -> head -> the kind's map.
Before any data every node gets ``first_iteration_prior``. Persistence: ``persist`` (no pickle).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.predictor.base import FitReport, is_root, labelled, node_labels, register_predictor
from trace_core.predictor.calibration import CALIBRATORS, Calibrator, IdentityMap, logit, sigmoid
from trace_core.predictor.config import PredictorConfig
from trace_core.predictor.features import FeatureBatch, check_no_nan, featurize
from trace_core.predictor.flip import FlipModel, continuation_pairs, with_remaining
from trace_core.predictor.model import SuccessHead, head_logits, train_head
from trace_core.predictor.prior import (
    COUNTS_SCHEMA,
    HierarchicalPrior,
    PriorView,
    cell_counts,
    outcome_counts,
    sibling_counts,
)

KINDS = ("root", "prefix")
TRACK_SCHEMA = {"kind": pl.Utf8, "iteration": pl.Int64, "p": pl.Float64, "y": pl.Float64, "w": pl.Float64}
EXTRA_DENSE = ("prior_logit", "log_evidence")  # appended to features.DENSE_NAMES


def _wmean(y: np.ndarray, w: np.ndarray, default: float) -> float:
    return float(np.sum(w * y) / np.sum(w)) if np.sum(w) > 0 else default


def _brier(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    # Brier against the trajectories' 0/1 outcomes: (p - y)^2 + y(1 - y) per node
    return float(np.sum(w * ((p - y) ** 2 + y * (1 - y))) / max(np.sum(w), 1e-12))


def decision_labels(nodes: pl.DataFrame, counts: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(y, w)`` ``(n,)`` of decision rows: a prefix's subtree label; a root's raw-rollout success rate
    from ``counts`` (``prior.outcome_counts``) - what root allocation predicts; continuations below a
    root are a sample chosen by prefix allocation, not the prompt's success rate."""
    y, w = node_labels(nodes)
    if nodes.height == 0 or counts.height == 0:
        return y, w
    raw = nodes.select(pl.int_range(nodes.height).alias("row"), "prompt_id", pl.col("iteration").cast(pl.Int64)).join(
        counts.select("prompt_id", "iteration", "s", "n"), on=["prompt_id", "iteration"], how="left").sort("row")
    roots = is_root(nodes) & raw["n"].is_not_null().to_numpy()
    n = raw["n"].fill_null(1.0).to_numpy()
    return np.where(roots, raw["s"].fill_null(0.0).to_numpy() / n, y), np.where(roots, n, w)


def decision_rows(nodes: pl.DataFrame) -> np.ndarray:
    """Boolean ``(n,)``: roots and raw non-leaf prefixes (the nodes scored at decision time)."""
    depth = nodes["depth"].fill_null(0).to_numpy()
    raw = (nodes["origin"].fill_null("raw") == "raw").to_numpy()
    leaf = nodes["is_leaf"].fill_null(False).to_numpy()
    return (depth == 0) | (raw & ~leaf)


class HashedPredictor:
    """See the module docstring. ``config`` is the full ``PredictorConfig``."""

    def __init__(self, config: PredictorConfig):
        self.config = config
        self.head: SuccessHead | None = None
        self.calibrators: dict[str, Calibrator] = {k: IdentityMap() for k in KINDS}  # final maps
        self.prior_maps: dict[str, Calibrator] = {k: IdentityMap() for k in KINDS}  # maps of the prior
        self.prior = HierarchicalPrior(config.prior, config.first_iteration_prior)
        self.cell_prior = pl.DataFrame(schema=COUNTS_SCHEMA)  # counts of iteration -1
        self.flip = FlipModel(config.flip)
        self.base_rate = {k: config.first_iteration_prior for k in KINDS}
        self.last_iteration = -1
        self.track = pl.DataFrame(schema=TRACK_SCHEMA)  # prospective predictions of earlier fits

    # -- features (the hf_encoder subclass overrides _featurize) ------------------------------------
    def _featurize(self, nodes: pl.DataFrame) -> FeatureBatch:
        return featurize(nodes, self.config.features)

    @property
    def n_buckets(self) -> int:
        return 1 << self.config.features.hash_bits

    def _as_of(self, nodes: pl.DataFrame) -> np.ndarray:
        return nodes["iteration"].cast(pl.Int64).fill_null(self.last_iteration + 1).to_numpy()

    def prior_view(self, nodes: pl.DataFrame) -> PriorView:
        """The raw prior for every row as of its iteration; prefixes also count their siblings."""
        if not self.config.prior.enabled:
            c = np.where(is_root(nodes), self.base_rate["root"], self.base_rate["prefix"])
            return PriorView(c, c, np.zeros(nodes.height), np.zeros(nodes.height))
        es, en = sibling_counts(nodes) if self.config.prior.siblings else (None, None)
        return self.prior.posterior(nodes, self._as_of(nodes), es, en)

    def prior_prob(self, nodes: pl.DataFrame, view: PriorView | None = None) -> np.ndarray:
        """The calibrated prior ``(n,)``: what the head refines and the flip model starts from."""
        view = view if view is not None else self.prior_view(nodes)
        return _by_kind(self.prior_maps, view.prompt, is_root(nodes))

    def _inputs(self, nodes: pl.DataFrame, q: np.ndarray, view: PriorView) -> tuple[FeatureBatch, np.ndarray]:
        fb = self._featurize(nodes)
        z = logit(q)
        extra = np.stack([z, np.log1p(view.evidence)], axis=1).astype(np.float32)
        return FeatureBatch(fb.idx, fb.vals, fb.offsets, np.concatenate([fb.dense, extra], axis=1)), z

    # -- fit ---------------------------------------------------------------------------------------------
    def _training_rows(self, base: pl.DataFrame, trainable: np.ndarray) -> np.ndarray:
        """Indices of ``trainable`` rows of ``base`` in whole iterations, newest first, up to the cap."""
        cap = self.config.model.max_train_nodes
        its = base["iteration"].cast(pl.Int64).fill_null(0).to_numpy()
        keep, total = [], 0
        for it in sorted(set(its[trainable].tolist()), reverse=True):
            keep.append(it)
            total += int(trainable[its == it].sum())
            if total >= cap:
                break
        rows = np.flatnonzero(trainable & np.isin(its, keep))
        if len(rows) > cap:
            rows = np.sort(np.random.default_rng(self.config.model.seed).choice(rows, cap, replace=False))
        return rows

    def fit(self, nodes: pl.DataFrame, *, cell_prior: pl.DataFrame | None = None) -> FitReport:
        t0 = time.perf_counter()
        check_no_nan(nodes)
        counts = outcome_counts(nodes)
        self._record_track(nodes, counts)  # the deployed (previous) fit, before anything changes
        if cell_prior is not None:
            self.cell_prior = cell_counts(cell_prior)
        lab = labelled(nodes)
        roots = is_root(lab)
        y_all, w_all = node_labels(lab)
        prior0 = self.config.first_iteration_prior
        self.base_rate = {"root": _wmean(y_all[roots], w_all[roots], prior0),
                          "prefix": _wmean(y_all[~roots], w_all[~roots], prior0)}  # fmt: skip
        iters = sorted({int(i) for i in lab["iteration"].drop_nulls().to_list()})
        self.last_iteration = max(iters) if iters else -1
        prior_rep = self.prior.fit(pl.concat([counts, self.cell_prior]))
        prior_rep["cell_prior_cells"] = self.cell_prior.height
        base = nodes.filter(pl.col("origin").fill_null("raw") != "extension") if nodes.height else nodes
        view = self.prior_view(base)
        trainable = decision_rows(base) & _is_labelled(base) if base.height else np.zeros(0, bool)
        calib = self._calibrate_prior(base, view, trainable, counts) | self._calibrate_track()
        n_calib = self.track.height
        q = self.prior_prob(base, view)
        common = dict(n_labelled=lab.height, n_roots=int(roots.sum()), n_prefixes=int((~roots).sum()),
                      iterations=iters, history_prompts=self.prior.counts["prompt_id"].drop_nulls().n_unique(),
                      prior=prior_rep, flip=self._fit_flip(nodes, base, q))  # fmt: skip
        rows = self._training_rows(base, trainable) if base.height else np.zeros(0, int)
        sub = base[rows]
        y, c = decision_labels(sub, counts)
        if len(rows) < self.config.model.min_fit_nodes or np.all(y == y[0]):
            self.head = None
            return FitReport(n_train=0, n_calib=n_calib, seconds=time.perf_counter() - t0, fallback=True,
                             warm_start=False, calib=calib, **common)  # fmt: skip
        kept = np.unique(np.r_[rows, np.flatnonzero(np.isin(base["iteration"].to_numpy(), sub["iteration"].to_numpy()))])
        fb, z = self._inputs(base[kept], q[kept], view.take(kept))  # ancestors ride along for the path text
        pos = np.searchsorted(kept, rows)
        fb, z = fb.take(pos), z[pos]
        mcfg = self.config.model
        age = (self.last_iteration - sub["iteration"].cast(pl.Int64).fill_null(0).to_numpy()).clip(0, None)
        w = np.minimum(c, mcfg.max_label_weight) * mcfg.recency_discount**age
        shape = (self.n_buckets, fb.dense.shape[1], mcfg.hidden)
        warm = self.head is not None and self.head.shape == shape
        self.head, info = train_head(fb, z, y, w, mcfg, self.n_buckets, self.head if warm else None)
        return FitReport(n_train=len(rows), n_calib=n_calib, seconds=time.perf_counter() - t0, fallback=False,
                         warm_start=warm, train_loss=info["train_loss"], calib=calib, steps=info["steps"],
                         batch_size=info["batch"], **common)  # fmt: skip

    def _calibrate_prior(self, base: pl.DataFrame, view: PriorView, trainable: np.ndarray, counts) -> dict:
        """Per kind, a map of the prior fitted on its own prospective record (see ``CalibrationConfig``)."""
        ccfg = self.config.calibration
        self.prior_maps = {k: IdentityMap() for k in KINDS}
        if ccfg.prior_method == "none" or not trainable.any():
            return {}
        rows = np.flatnonzero(trainable & (view.cell_evidence > 0))
        sub = base[rows]
        y, c = decision_labels(sub, counts)
        age = (self.last_iteration - sub["iteration"].cast(pl.Int64).fill_null(0).to_numpy()).clip(0, None)
        w = np.minimum(c, self.config.model.max_label_weight) * self.config.model.recency_discount**age
        report = {}
        for kind, m in _kind_masks(is_root(sub)):
            if m.sum() < ccfg.min_prior_nodes:
                report[f"prior_{kind}"] = {"n": float(m.sum()), "method": "skipped"}
                continue
            p = view.prompt[rows][m]
            report[f"prior_{kind}"], self.prior_maps[kind] = _fit_map(ccfg.prior_method, p, y[m], w[m], ccfg)
        return report

    def _record_track(self, nodes: pl.DataFrame, counts: pl.DataFrame) -> None:
        """Before refitting: the deployed model predicts the labelled decision rows of iterations it
        has not seen (prospective predictions); they join the track record (newest iterations kept)."""
        if self.prior.empty or nodes.height == 0:
            return  # never fitted: constant predictions say nothing about calibration
        unseen = nodes.filter(pl.col("iteration").cast(pl.Int64) > self.last_iteration)
        keep = decision_rows(unseen) & _is_labelled(unseen) if unseen.height else np.zeros(0, bool)
        if not keep.any():
            return
        p = self.predict_uncalibrated(unseen)[keep]  # the whole frame: ancestors and siblings ride along
        new = unseen.filter(pl.Series(keep))
        y, w = decision_labels(new, counts)
        rec = pl.DataFrame({"kind": np.where(is_root(new), "root", "prefix"), "iteration": new["iteration"],
                            "p": p, "y": y, "w": w}, schema=TRACK_SCHEMA)  # fmt: skip
        track = pl.concat([self.track, rec])
        newest = int(track["iteration"].max())
        self.track = track.filter(pl.col("iteration") > newest - self.config.calibration.track_iterations)

    def _calibrate_track(self) -> dict:
        """Per kind with ``min_nodes`` recorded predictions: a map fitted on the track record."""
        ccfg = self.config.calibration
        self.calibrators = {k: IdentityMap() for k in KINDS}
        if ccfg.method == "none" or self.track.height == 0:
            return {}
        report = {}
        newest = int(self.track["iteration"].max())
        for kind in KINDS:
            t = self.track.filter(pl.col("kind") == kind)
            p = t["p"].to_numpy()
            if t.height < ccfg.min_nodes or np.std(logit(p)) < 1e-3:
                report[kind] = {"n": float(t.height), "method": "skipped"}
                continue
            w = t["w"].to_numpy() * ccfg.track_discount ** (newest - t["iteration"].to_numpy())
            report[kind], self.calibrators[kind] = _fit_map(ccfg.method, p, t["y"].to_numpy(), w, ccfg)
        return report

    def _fit_flip(self, nodes: pl.DataFrame, base: pl.DataFrame, q: np.ndarray) -> dict:
        pairs = continuation_pairs(nodes) if nodes.height else continuation_pairs(base)
        if pairs.height == 0:
            self.flip = FlipModel(self.config.flip)
            return {"continuations": 0.0, "logistic": False}
        index = pl.DataFrame({"node_id": base["node_id"], "row": np.arange(base.height)})
        pairs = pairs.join(index, on="node_id")
        rows = pairs["row"].to_numpy()
        br = with_remaining(base[rows], base)
        age = (self.last_iteration - br["iteration"].cast(pl.Int64).fill_null(0).to_numpy()).clip(0, None)
        return self.flip.fit(q[rows], pairs["r"].to_numpy(), br["depth"].fill_null(1).to_numpy(),
                             br["remaining"].to_numpy(), br["tool_errors"].fill_null(0).to_numpy(),
                             pairs["n"].to_numpy(), pairs["f"].to_numpy(),
                             self.config.flip.discount**age)  # fmt: skip

    # -- predict -----------------------------------------------------------------------------------------
    def predict_uncalibrated(self, nodes: pl.DataFrame) -> np.ndarray:
        """Calibrated prior refined by the head, ``(n,)`` in [0, 1], before the final per-kind map."""
        check_no_nan(nodes)
        if nodes.height == 0:
            return np.zeros(0)
        if self.prior.empty and self.config.prior.enabled:
            return np.full(nodes.height, self.config.first_iteration_prior, dtype=np.float64)
        view = self.prior_view(nodes)
        q = self.prior_prob(nodes, view)
        if self.head is None:
            return q
        fb, z = self._inputs(nodes, q, view)
        return sigmoid(head_logits(self.head, fb, z))

    def predict(self, nodes: pl.DataFrame) -> np.ndarray:
        """Success probability ``(n,)`` float64 in [0, 1] of every row of ``nodes``."""
        p = self.predict_uncalibrated(nodes)
        return np.clip(_by_kind(self.calibrators, p, is_root(nodes)), 0.0, 1.0) if nodes.height else p

    def predict_flip(self, prefixes: pl.DataFrame) -> np.ndarray:
        """P(continuation reward != r) ``(n,)`` for prefix rows with column ``r`` (the raw
        trajectory's 0/1 reward). Optional column ``remaining`` (turns the raw trajectory took after
        the prefix); without it, taken from the raw leaf of the row's trajectory in the frame."""
        if "r" not in prefixes.columns:
            raise ValueError("predict_flip needs column 'r': the 0/1 reward of the raw trajectory through the prefix")
        check_no_nan(prefixes)
        if prefixes.height == 0:
            return np.zeros(0)
        frame = with_remaining(prefixes)
        v = self.prior_prob(prefixes)
        return self.flip.predict(v, frame["r"].cast(pl.Float64).fill_null(0.0).to_numpy(),
                                 frame["depth"].fill_null(1).to_numpy(), frame["remaining"].to_numpy(),
                                 frame["tool_errors"].fill_null(0).to_numpy())  # fmt: skip

    def predict_baselines(self, nodes: pl.DataFrame) -> dict[str, np.ndarray]:
        """Reference predictors, each ``(n,)``: ``constant`` (per-kind mean label of the fit),
        ``history`` (the prompt's own record around that constant) and ``prior`` (the hierarchical
        prior alone, no head)."""
        check_no_nan(nodes)
        roots = is_root(nodes)
        const = np.where(roots, self.base_rate["root"], self.base_rate["prefix"]).astype(np.float64)
        a = self.prior.counts_asof(nodes, self._as_of(nodes))
        kp = self.prior.kappa_prompt
        hist = (kp * self.base_rate["root"] + a["ps"]) / np.maximum(kp + a["pn"], 1e-12)
        prior = self.prior_prob(nodes) if nodes.height else np.zeros(0)
        return {"constant": const, "history": np.clip(hist, 0.0, 1.0), "prior": prior}

    # -- persistence (tasks pass paths, not objects) -------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        from trace_core.predictor.persist import save_predictor

        return save_predictor(self, path)

    @staticmethod
    def load(path: str | Path) -> HashedPredictor:
        from trace_core.predictor.persist import load_predictor

        return load_predictor(path)


def _is_labelled(nodes: pl.DataFrame) -> np.ndarray:
    return (nodes["subtree_mean_reward"].is_not_null() & nodes["subtree_mean_reward"].is_finite().fill_null(False)
            & (nodes["subtree_count"].fill_null(0) > 0)).to_numpy()  # fmt: skip


def _kind_masks(roots: np.ndarray) -> tuple[tuple[str, np.ndarray], tuple[str, np.ndarray]]:
    return ("root", roots), ("prefix", ~roots)


def _by_kind(maps: dict[str, Calibrator], p: np.ndarray, roots: np.ndarray) -> np.ndarray:
    return np.where(roots, maps["root"](p), maps["prefix"](p)) if len(p) else np.zeros(0)


def _fit_map(method: str, p, y, w, ccfg) -> tuple[dict, Calibrator]:
    """Fit one calibration map (isotonic falls back to Platt below ``min_isotonic_nodes``)."""
    if method == "isotonic" and len(p) < ccfg.min_isotonic_nodes:
        method = "platt"
    cal = CALIBRATORS[method](p, y, w)
    return {"n": float(len(p)), "method": cal.to_state()["method"], "brier_before": _brier(p, y, w),
            "brier_after": _brier(cal(p), y, w)}, cal  # fmt: skip


@register_predictor("hashed_mlp")
def _hashed_mlp(config: PredictorConfig) -> HashedPredictor:
    return HashedPredictor(config)


@register_predictor("hashed_logistic")
def _hashed_logistic(config: PredictorConfig) -> HashedPredictor:
    return HashedPredictor(config.model_copy(update={"model": config.model.model_copy(update={"hidden": 0})}))
