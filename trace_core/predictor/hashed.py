"""The default CPU-fast predictor: hashed text + structure + policy signals -> torch head ->
per-kind calibration -> per-prompt Beta posterior.

Registered as ``hashed_mlp`` (``model.hidden`` as configured, default 16) and ``hashed_logistic``
(``hidden = 0``).

``fit`` (all labelled nodes so far):
1. history: ``PromptHistory`` from every labelled root;
2. bounded training set: whole iterations, newest first, until ``max_train_nodes`` labelled nodes
   (then a seeded subsample); weight = ``min(subtree_count, max_label_weight)`` times
   ``recency_discount ** age``;
3. a held-out ``holdout_fraction`` of prompts (by a seeded hash of ``prompt_id``) for calibration;
4. the head trains on the rest, warm-starting from the previous fit (``warm_epochs``) when the
   feature layout is unchanged;
5. one calibration map per node kind (root / prefix) on the held-out nodes; Platt with
   ``calibration.drift`` also fits the outcomes' logit drift per iteration and applies it (at most
   one step ahead) so predictions do not lag an improving policy.

``predict``: calibrated head probability, then for roots the Beta posterior with that probability as
the prior; prefixes are shifted in logit space by their prompt's ``logit(posterior) - logit(model)``
of the root row in the same frame (``history.shift_prefixes``). Before any fit (first iteration)
every node gets ``first_iteration_prior``; with too few labels (``min_fit_nodes``) or a single
outcome class the model part is the per-kind weighted mean label (still combined with history).
"""

from __future__ import annotations

import pickle
import time
import zlib
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.predictor.base import FitReport, is_root, labelled, node_labels, register_predictor
from trace_core.predictor.calibration import CALIBRATORS, Calibrator, IdentityMap, logit, sigmoid
from trace_core.predictor.config import PredictorConfig
from trace_core.predictor.features import FeatureBatch, check_no_nan, featurize
from trace_core.predictor.history import PromptHistory
from trace_core.predictor.model import SuccessHead, head_logits, train_head

KINDS = ("root", "prefix")


def _wmean(y: np.ndarray, w: np.ndarray, default: float) -> float:
    return float(np.sum(w * y) / np.sum(w)) if np.sum(w) > 0 else default


def _brier(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    # Brier against the trajectories' 0/1 outcomes: (p - y)^2 + y(1 - y) per node
    return float(np.sum(w * ((p - y) ** 2 + y * (1 - y))) / max(np.sum(w), 1e-12))


class HashedPredictor:
    """See the module docstring. ``config`` is the full ``PredictorConfig``."""

    def __init__(self, config: PredictorConfig):
        self.config = config
        self.head: SuccessHead | None = None
        self.calibrators: dict[str, Calibrator] = {k: IdentityMap() for k in KINDS}
        h = config.history
        self.history = PromptHistory(h.discount, h.prior_strength)
        self.base_rate: dict[str, float] | None = None  # None = never fitted -> first-iteration prior
        self.last_iteration = 0.0

    # -- features (the hf_encoder subclass overrides this) -------------------------------------------
    def _featurize(self, nodes: pl.DataFrame) -> FeatureBatch:
        return featurize(nodes, self.config.features)

    @property
    def n_buckets(self) -> int:
        return 1 << self.config.features.hash_bits

    # -- fit -------------------------------------------------------------------------------------------
    def _training_frame(self, nodes: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
        """The bounded training frame (whole iterations, newest first) and its labelled row indices."""
        cap = self.config.model.max_train_nodes
        its = nodes["iteration"].cast(pl.Int64).fill_null(0)
        lab_mask = (
            nodes["subtree_mean_reward"].is_not_null()
            & nodes["subtree_mean_reward"].is_finite().fill_null(False)
            & (nodes["subtree_count"].fill_null(0) > 0)
        ).to_numpy()
        per_it = pl.DataFrame({"it": its, "lab": lab_mask}).group_by("it").agg(pl.col("lab").sum()).sort("it")
        keep, total = [], 0
        for it, n_lab in zip(per_it["it"].to_list()[::-1], per_it["lab"].to_list()[::-1], strict=True):
            keep.append(it)
            total += n_lab
            if total >= cap:
                break
        frame = nodes.filter(its.is_in(keep).to_numpy())
        rows = np.flatnonzero(lab_mask[its.is_in(keep).to_numpy()])
        if len(rows) > cap:
            rows = np.sort(np.random.default_rng(self.config.model.seed).choice(rows, cap, replace=False))
        return frame, rows

    def _holdout_mask(self, prompt_ids: list[str]) -> np.ndarray:
        frac = self.config.calibration.holdout_fraction
        if self.config.calibration.method == "none" or frac <= 0:
            return np.zeros(len(prompt_ids), dtype=bool)
        salt = str(self.config.model.seed)
        u = np.array([zlib.crc32(f"{salt}/{p}".encode()) / 2**32 for p in prompt_ids])
        return u < frac

    def fit(self, nodes: pl.DataFrame) -> FitReport:
        t0 = time.perf_counter()
        check_no_nan(nodes)
        mcfg = self.config.model
        lab = labelled(nodes)
        self.history = PromptHistory.from_nodes(
            lab, self.config.history.discount, self.config.history.prior_strength
        )
        roots = is_root(lab)
        y_all, w_all = node_labels(lab)
        prior = self.config.first_iteration_prior
        self.base_rate = {
            "root": _wmean(y_all[roots], w_all[roots], prior),
            "prefix": _wmean(y_all[~roots], w_all[~roots], prior),
        }
        iters = sorted({int(i) for i in lab["iteration"].drop_nulls().to_list()})
        self.last_iteration = float(max(iters)) if iters else 0.0
        common = dict(
            n_labelled=lab.height,
            n_roots=int(roots.sum()),
            n_prefixes=int((~roots).sum()),
            iterations=iters,
            history_prompts=self.history.n_prompts,
        )
        single_class = lab.height == 0 or np.all(y_all == y_all[0])
        if lab.height < mcfg.min_fit_nodes or single_class:
            self.head = None
            self.calibrators = {k: IdentityMap() for k in KINDS}
            return FitReport(n_train=0, n_calib=0, seconds=time.perf_counter() - t0, fallback=True,
                             warm_start=False, **common)  # fmt: skip

        frame, rows = self._training_frame(nodes)
        fb = self._featurize(frame).take(rows)
        sub = frame[rows]
        y, c = node_labels(sub)
        age = (max(iters) if iters else 0) - sub["iteration"].cast(pl.Int64).fill_null(0).to_numpy()
        w = np.minimum(c, mcfg.max_label_weight) * mcfg.recency_discount ** np.maximum(age, 0)
        hold = self._holdout_mask(sub["prompt_id"].to_list())
        if hold.all():
            hold[:] = False
        train = np.flatnonzero(~hold)
        warm = self.head is not None and self.head.dense.in_features == fb.dense.shape[1]
        self.head, loss = train_head(
            fb.take(train), y[train], w[train], mcfg, self.n_buckets, self.head if warm else None
        )
        calib = self._calibrate(fb, sub, y, w, np.flatnonzero(hold))
        return FitReport(n_train=len(train), n_calib=int(hold.sum()), seconds=time.perf_counter() - t0,
                         fallback=False, warm_start=warm, train_loss=loss, calib=calib, **common)  # fmt: skip

    def _calibrate(self, fb: FeatureBatch, sub: pl.DataFrame, y, w, hold: np.ndarray) -> dict:
        ccfg = self.config.calibration
        self.calibrators = {k: IdentityMap() for k in KINDS}
        report: dict[str, dict[str, float]] = {}
        if len(hold) == 0:
            return report
        p_raw = sigmoid(head_logits(self.head, fb.take(hold)))
        roots = is_root(sub[hold])
        its = sub[hold]["iteration"].cast(pl.Int64).fill_null(0).to_numpy()
        for kind, mask in (("root", roots), ("prefix", ~roots)):
            if mask.sum() < ccfg.min_holdout_nodes:
                continue
            p, yy, ww = p_raw[mask], y[hold][mask], w[hold][mask]
            tt = its[mask] if ccfg.drift else None
            cal = CALIBRATORS[ccfg.method](p, yy, ww, tt)
            self.calibrators[kind] = cal
            report[kind] = {"n": int(mask.sum()), "brier_before": _brier(p, yy, ww),
                            "brier_after": _brier(cal(p, tt), yy, ww),
                            "drift_per_iteration": float(getattr(cal, "c", 0.0))}  # fmt: skip
        return report

    # -- predict ---------------------------------------------------------------------------------------
    def predict_model(self, nodes: pl.DataFrame) -> np.ndarray:
        """The calibrated model part alone (no history), ``(n,)`` in [0, 1]."""
        check_no_nan(nodes)
        roots = is_root(nodes)
        if self.base_rate is None:
            return np.full(nodes.height, self.config.first_iteration_prior, dtype=np.float64)
        if self.head is None:
            return np.where(roots, self.base_rate["root"], self.base_rate["prefix"]).astype(np.float64)
        p = sigmoid(head_logits(self.head, self._featurize(nodes)))
        # a node without an iteration is taken to be from the next one (one step past the fit)
        its = nodes["iteration"].cast(pl.Float64).fill_null(self.last_iteration + 1.0).to_numpy()
        out = np.empty_like(p)
        out[roots] = self.calibrators["root"](p[roots], its[roots])
        out[~roots] = self.calibrators["prefix"](p[~roots], its[~roots])
        return np.clip(out, 0.0, 1.0)

    def _with_history(self, nodes: pl.DataFrame, p_model: np.ndarray) -> np.ndarray:
        if not self.config.history.enabled or self.history.records.height == 0 or nodes.height == 0:
            return p_model
        roots = is_root(nodes)
        pids = nodes["prompt_id"].to_list()
        its = nodes["iteration"].cast(pl.Int64).fill_null(-1).to_numpy()
        post = self.history.posterior(p_model, pids, its)
        out = np.where(roots, post, p_model)
        if self.config.history.shift_prefixes and (~roots).any() and roots.any():
            gap = dict(
                zip(
                    np.asarray(pids, dtype=object)[roots],
                    logit(post[roots]) - logit(p_model[roots]),
                    strict=True,
                )
            )
            shift = np.array([gap.get(pid, 0.0) for pid in pids])
            out = np.where(roots, out, sigmoid(logit(p_model) + shift))
        return np.clip(out, 0.0, 1.0)

    def predict(self, nodes: pl.DataFrame) -> np.ndarray:
        """Success probability ``(n,)`` float64 in [0, 1] of every row of ``nodes``."""
        return self._with_history(nodes, self.predict_model(nodes))

    def predict_baselines(self, nodes: pl.DataFrame) -> dict[str, np.ndarray]:
        """The two reference predictors, each ``(n,)``: ``constant`` (per-kind mean label of the fit)
        and ``history`` (each prompt's Beta posterior around that constant; prefixes take their
        prompt's root posterior)."""
        check_no_nan(nodes)
        roots = is_root(nodes)
        rate = self.base_rate or {k: self.config.first_iteration_prior for k in KINDS}
        const = np.where(roots, rate["root"], rate["prefix"]).astype(np.float64)
        its = nodes["iteration"].cast(pl.Int64).fill_null(-1).to_numpy()
        hist = self.history.posterior(np.full(nodes.height, rate["root"]), nodes["prompt_id"].to_list(), its)
        return {"constant": const, "history": hist}

    # -- persistence (tasks pass paths, not objects) -----------------------------------------------------
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(self, f)
        tmp.replace(path)
        return path

    @staticmethod
    def load(path: str | Path) -> HashedPredictor:
        with open(path, "rb") as f:
            return pickle.load(f)


@register_predictor("hashed_mlp")
def _hashed_mlp(config: PredictorConfig) -> HashedPredictor:
    return HashedPredictor(config)


@register_predictor("hashed_logistic")
def _hashed_logistic(config: PredictorConfig) -> HashedPredictor:
    return HashedPredictor(config.model_copy(update={"model": config.model.model_copy(update={"hidden": 0})}))
