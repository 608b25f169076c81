"""The default CPU-fast predictor: hierarchical prior -> per-kind map -> torch head (a correction
of the prior's logit, for prefixes) -> per-kind map; plus the continuation flip model.

Registered as ``hashed_mlp`` (``model.hidden`` as configured, default 16) and ``hashed_logistic``
(``hidden = 0``).

``fit(nodes, *, cell_prior=None)`` with every labelled node so far:

1. track record: the deployed fit first predicts the labelled nodes of iterations it has not seen
   (prospective predictions), kept with their outcomes for the final map (step 6);
2. prior: outcome counts per (prompt, iteration) of the raw rollouts, plus ``cell_prior`` (the
   held-out evaluation per (family, difficulty), measured before training; kept for later
   refreshes) -> ``HierarchicalPrior`` (empirical-Bayes strengths and discount). This is what makes
   iteration 0 not blind and a cell solved every time predicted near 1 after one iteration;
3. the prior's map per kind: the prior of a past node *as of its iteration* is a prospective
   prediction, so the map (Platt, scikit-learn) is fitted on every labelled node, no split needed;
   with ``reference.enabled``, then the roots' reference term on that mapped prior (``reference``:
   the policy's log-probability of the task's worked solution, ranked within its cell);
4. the flip model on the stored continuations (``flip``);
5. the head: trained on labelled roots and raw non-leaf prefixes (whole iterations, newest first,
   up to ``max_train_nodes``; weight ``min(subtree_count, max_label_weight) * recency_discount **
   age``), offset = the mapped prior's logit as of the row's iteration (plus, for a prefix, its
   finished sibling rollouts), so it learns what the prior misses one iteration ahead; a number of
   optimiser steps, warm-started. Its correction is applied to prefixes (roots too with
   ``model.refine_roots``);
6. the final map per refined kind, on the track record (when there are ``min_nodes`` of it).

Labels: a root's raw-rollout success rate (``decision_labels``), a prefix's subtree mean.
``predict``: prior as of the row's iteration (null = one past the fit) -> map -> head -> map.
Before any data every node gets ``first_iteration_prior``. Persistence: ``persist`` (no pickle).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.predictor.base import (
    FitReport,
    decision_labels,
    decision_rows,
    is_labelled,
    is_root,
    labelled,
    node_labels,
    register_predictor,
)
from trace_core.predictor.calibration import (
    TRACK_SCHEMA,
    Calibrator,
    IdentityMap,
    by_kind,
    fit_map,
    logit,
    sigmoid,
)
from trace_core.predictor.config import PredictorConfig
from trace_core.predictor.features import FeatureBatch, check_no_nan, featurize
from trace_core.predictor.flip import FlipModel, continuation_pairs, with_remaining
from trace_core.predictor.model import SuccessHead, head_logits, train_head
from trace_core.predictor.persist import save_predictor
from trace_core.predictor.prior import (
    COUNTS_SCHEMA,
    HierarchicalPrior,
    PriorView,
    cell_counts,
    outcome_counts,
    sibling_counts,
)
from trace_core.predictor.reference import ReferenceTerm, group_keys

KINDS = ("root", "prefix")
EXTRA_DENSE = ("prior_logit", "log_evidence")  # appended to features.DENSE_NAMES for the head


def _wmean(y: np.ndarray, w: np.ndarray, default: float) -> float:
    return float(np.sum(w * y) / np.sum(w)) if np.sum(w) > 0 else default


class HashedPredictor:
    """See the module docstring. ``config`` is the full ``PredictorConfig``."""

    def __init__(self, config: PredictorConfig):
        self.config = config
        self.head: SuccessHead | None = None
        self.prior = HierarchicalPrior(config.prior, config.first_iteration_prior)
        self.prior_maps: dict[str, Calibrator] = {k: IdentityMap() for k in KINDS}  # step 3
        self.calibrators: dict[str, Calibrator] = {k: IdentityMap() for k in KINDS}  # step 6
        self.cell_prior = pl.DataFrame(schema=COUNTS_SCHEMA)  # counts of iteration -1
        self.flip = FlipModel(config.flip)
        self.reference = ReferenceTerm()  # step 3b
        self.track = pl.DataFrame(schema=TRACK_SCHEMA)  # prospective predictions of earlier fits
        self.base_rate = {k: config.first_iteration_prior for k in KINDS}
        self.last_iteration = -1

    # -- inputs (the hf_encoder subclass overrides _featurize) ------------------------------------------
    def _featurize(self, nodes: pl.DataFrame) -> FeatureBatch:
        return featurize(nodes, self.config.features)

    @property
    def n_buckets(self) -> int:
        return 1 << self.config.features.hash_bits

    def _as_of(self, nodes: pl.DataFrame) -> np.ndarray:
        return nodes["iteration"].cast(pl.Int64).fill_null(self.last_iteration + 1).to_numpy()

    def _age_weight(self, nodes: pl.DataFrame, counts: np.ndarray) -> np.ndarray:
        age = (self.last_iteration - nodes["iteration"].cast(pl.Int64).fill_null(0).to_numpy()).clip(0, None)
        m = self.config.model
        return np.minimum(counts, m.max_label_weight) * m.recency_discount**age

    def prior_view(self, nodes: pl.DataFrame) -> PriorView:
        """The raw prior of every row as of its iteration; prefixes also count their siblings."""
        if not self.config.prior.enabled:
            c = np.where(is_root(nodes), self.base_rate["root"], self.base_rate["prefix"])
            return PriorView(c, c, np.zeros(nodes.height), np.zeros(nodes.height))
        es, en = sibling_counts(nodes) if self.config.prior.siblings else (None, None)
        return self.prior.posterior(nodes, self._as_of(nodes), es, en)

    def prior_prob(self, nodes: pl.DataFrame, view: PriorView | None = None) -> np.ndarray:
        """The mapped prior ``(n,)`` with the roots' reference term: what the head refines and the
        flip model starts from."""
        view = view if view is not None else self.prior_view(nodes)
        q = by_kind(self.prior_maps, view.prompt, is_root(nodes))
        if not self.reference.coefs or "ref_score" not in nodes.columns:
            return q
        score, groups = self._reference_inputs(nodes, view)
        return sigmoid(self.reference.apply(logit(q), score, groups))

    def _reference_inputs(self, nodes: pl.DataFrame, view: PriorView) -> tuple[np.ndarray, np.ndarray]:
        """``(score, group)`` per row: ``ref_score`` on roots (NaN elsewhere or missing), and the
        group (family, whether the prompt has a record as of the row's iteration)."""
        score = nodes["ref_score"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "ref_score" in nodes.columns \
            else np.full(nodes.height, np.nan)
        score = np.where(is_root(nodes), score, np.nan)
        return score, group_keys(nodes["task"].to_list(), view.evidence > 0)

    def _inputs(self, nodes: pl.DataFrame, q: np.ndarray, view: PriorView) -> tuple[FeatureBatch, np.ndarray]:
        fb = self._featurize(nodes)
        z = logit(q)
        extra = np.stack([z, np.log1p(view.evidence)], axis=1).astype(np.float32)
        return FeatureBatch(fb.idx, fb.vals, fb.offsets, np.concatenate([fb.dense, extra], axis=1)), z

    def _refined(self, nodes: pl.DataFrame) -> np.ndarray:
        """Boolean ``(n,)``: rows the head corrects (prefixes; roots too with ``model.refine_roots``)."""
        return ~is_root(nodes) | self.config.model.refine_roots

    # -- fit ---------------------------------------------------------------------------------------------
    def fit(self, nodes: pl.DataFrame, *, cell_prior: pl.DataFrame | None = None) -> FitReport:
        t0 = time.perf_counter()
        check_no_nan(nodes)
        counts = outcome_counts(nodes)
        self._record_track(nodes, counts)  # (1) with the deployed fit, before anything changes
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
        prior_rep = self.prior.fit(pl.concat([counts, self.cell_prior])) | {"cell_prior_cells": self.cell_prior.height}
        base = nodes.filter(pl.col("origin").fill_null("raw") != "extension") if nodes.height else nodes
        view = self.prior_view(base)
        trainable = decision_rows(base) & is_labelled(base) if base.height else np.zeros(0, bool)
        calib = self._map_prior(base, view, trainable, counts) | self._map_track()  # (3), (6)
        calib |= self._fit_reference(base, view, trainable, counts)  # (3b)
        q = self.prior_prob(base, view)
        report = dict(n_labelled=lab.height, n_roots=int(roots.sum()), n_prefixes=int((~roots).sum()),
                      iterations=iters, history_prompts=self.prior.counts["prompt_id"].drop_nulls().n_unique(),
                      prior=prior_rep, flip=self._fit_flip(nodes, base, q), calib=calib,
                      n_calib=self.track.height)  # fmt: skip
        report |= self._fit_head(base, trainable, q, view, counts)  # (5)
        return FitReport(seconds=time.perf_counter() - t0, **report)

    def _fit_head(self, base: pl.DataFrame, trainable: np.ndarray, q, view: PriorView, counts) -> dict:
        rows = self._training_rows(base, trainable) if base.height else np.zeros(0, int)
        y, c = decision_labels(base[rows], counts)
        if len(rows) < self.config.model.min_fit_nodes or np.all(y == y[0]):
            self.head = None
            return {"n_train": 0, "fallback": True, "warm_start": False}
        its = base["iteration"].to_numpy()
        kept = np.flatnonzero(np.isin(its, its[rows]))  # whole iterations: ancestors give the path text
        fb, z = self._inputs(base[kept], q[kept], view.take(kept))
        pos = np.searchsorted(kept, rows)
        fb, z = fb.take(pos), z[pos]
        shape = (self.n_buckets, fb.dense.shape[1], self.config.model.hidden)
        warm = self.head is not None and self.head.shape == shape
        w = self._age_weight(base[rows], c)
        self.head, info = train_head(fb, z, y, w, self.config.model, self.n_buckets, self.head if warm else None)
        return {"n_train": len(rows), "fallback": False, "warm_start": warm, "train_loss": info["train_loss"],
                "steps": info["steps"], "batch_size": info["batch"]}  # fmt: skip

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

    def _map_prior(self, base: pl.DataFrame, view: PriorView, trainable: np.ndarray, counts) -> dict:
        """Per kind, a map of the prior fitted on its own prospective record (nodes with a cell record)."""
        ccfg = self.config.calibration
        self.prior_maps = {k: IdentityMap() for k in KINDS}
        rows = np.flatnonzero(trainable & (view.cell_evidence > 0)) if len(trainable) else np.zeros(0, int)
        if ccfg.prior_method == "none" or len(rows) == 0:
            return {}
        sub = base[rows]
        y, c = decision_labels(sub, counts)
        w, p, roots = self._age_weight(sub, c), view.prompt[rows], is_root(sub)
        report = {}
        for kind, m in (("root", roots), ("prefix", ~roots)):
            if m.sum() < ccfg.min_prior_nodes:
                report[f"prior_{kind}"] = {"n": float(m.sum()), "method": "skipped"}
                continue
            report[f"prior_{kind}"], self.prior_maps[kind] = fit_map(
                ccfg.prior_method, p[m], y[m], w[m], min_isotonic_nodes=ccfg.min_isotonic_nodes)
        return report

    def _fit_reference(self, base: pl.DataFrame, view: PriorView, trainable: np.ndarray, counts) -> dict:
        """The roots' reference term on the scored, labelled roots (offset: the mapped prior's logit)."""
        rcfg = self.config.reference
        self.reference = ReferenceTerm()
        if not rcfg.enabled or "ref_score" not in base.columns or not len(trainable):
            return {}
        score, groups = self._reference_inputs(base, view)
        rows = np.flatnonzero(trainable & np.isfinite(score))
        if len(rows) == 0:
            return {}
        sub = base[rows]
        y, c = decision_labels(sub, counts)
        z = logit(by_kind(self.prior_maps, view.prompt[rows], is_root(sub)))
        report = self.reference.fit(score[rows], z, y, self._age_weight(sub, c), groups[rows],
                                    l2=rcfg.l2, min_nodes=rcfg.min_nodes, group_l2=rcfg.group_l2)
        return {f"reference_{g}": r for g, r in report.items()}

    def _record_track(self, nodes: pl.DataFrame, counts: pl.DataFrame) -> None:
        """The deployed model predicts the labelled decision rows of iterations it has not seen
        (prospective predictions); they join the track record (newest ``track_iterations`` kept)."""
        if self.prior.empty or nodes.height == 0:
            return  # never fitted: constant predictions say nothing about calibration
        unseen = nodes.filter(pl.col("iteration").cast(pl.Int64) > self.last_iteration)
        keep = decision_rows(unseen) & is_labelled(unseen) if unseen.height else np.zeros(0, bool)
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

    def _map_track(self) -> dict:
        """Per refined kind with ``min_nodes`` recorded predictions: the final map on the track record."""
        ccfg = self.config.calibration
        self.calibrators = {k: IdentityMap() for k in KINDS}
        if ccfg.method == "none" or self.track.height == 0:
            return {}
        report, newest = {}, int(self.track["iteration"].max())
        for kind in KINDS if self.config.model.refine_roots else ("prefix",):  # roots: the prior's map
            t = self.track.filter(pl.col("kind") == kind)
            p = t["p"].to_numpy()
            if t.height < ccfg.min_nodes or np.std(logit(p)) < 1e-3:
                report[kind] = {"n": float(t.height), "method": "skipped"}
                continue
            w = t["w"].to_numpy() * ccfg.track_discount ** (newest - t["iteration"].to_numpy())
            report[kind], self.calibrators[kind] = fit_map(ccfg.method, p, t["y"].to_numpy(), w,
                                                           min_isotonic_nodes=ccfg.min_isotonic_nodes)  # fmt: skip
        return report

    def _fit_flip(self, nodes: pl.DataFrame, base: pl.DataFrame, q: np.ndarray) -> dict:
        pairs = continuation_pairs(nodes) if nodes.height else pl.DataFrame()
        if pairs.height == 0:
            self.flip = FlipModel(self.config.flip)
            return {"continuations": 0.0, "logistic": False}
        pairs = pairs.join(pl.DataFrame({"node_id": base["node_id"], "row": np.arange(base.height)}), on="node_id")
        rows = pairs["row"].to_numpy()
        br = with_remaining(base[rows], base)
        age = (self.last_iteration - br["iteration"].cast(pl.Int64).fill_null(0).to_numpy()).clip(0, None)
        return self.flip.fit(q[rows], pairs["r"].to_numpy(), br["depth"].fill_null(1).to_numpy(),
                             br["remaining"].to_numpy(), br["tool_errors"].fill_null(0).to_numpy(),
                             pairs["n"].to_numpy(), pairs["f"].to_numpy(), self.config.flip.discount**age)  # fmt: skip

    # -- predict -----------------------------------------------------------------------------------------
    def predict_uncalibrated(self, nodes: pl.DataFrame) -> np.ndarray:
        """Mapped prior refined by the head, ``(n,)`` in [0, 1], before the final per-kind map."""
        check_no_nan(nodes)
        if nodes.height == 0:
            return np.zeros(0)
        if self.prior.empty and self.config.prior.enabled:
            return np.full(nodes.height, self.config.first_iteration_prior, dtype=np.float64)
        view = self.prior_view(nodes)
        q = self.prior_prob(nodes, view)
        refine = self._refined(nodes)
        if self.head is None or not refine.any():
            return q
        fb, z = self._inputs(nodes, q, view)
        return np.where(refine, sigmoid(head_logits(self.head, fb, z)), q)

    def predict(self, nodes: pl.DataFrame) -> np.ndarray:
        """Success probability ``(n,)`` float64 in [0, 1] of every row of ``nodes``."""
        p = self.predict_uncalibrated(nodes)
        return np.clip(by_kind(self.calibrators, p, is_root(nodes)), 0.0, 1.0) if nodes.height else p

    def predict_concentration(self, nodes: pl.DataFrame) -> np.ndarray | None:
        """Pseudo-trajectories behind each row's prediction ``(n,)``: the prompt strength of the
        prior plus the prompt's discounted record (a prefix's siblings included) -- ``v`` and this
        ``c`` make the posterior ``Beta(c v, c (1 - v))`` the root allocation may value prompts
        under (``root_posterior``). None without a fitted prior: no posterior to speak of."""
        check_no_nan(nodes)
        if not self.config.prior.enabled or self.prior.empty:
            return None
        if nodes.height == 0:
            return np.zeros(0)
        return float(self.prior.kappa_prompt) + self.prior_view(nodes).evidence

    def predict_flip(self, prefixes: pl.DataFrame, *, nodes: pl.DataFrame | None = None) -> np.ndarray:
        """P(continuation reward != r) ``(n,)`` for prefix rows with column ``r`` (the 0/1 reward of
        the raw trajectory through the prefix). ``nodes``: the frame the prefixes come from (the
        iteration's raw rollouts): their finished siblings inform each prefix's prior and the raw
        leaves give ``remaining`` (turns the raw trajectory took after the prefix; a ``remaining``
        column in ``prefixes`` wins). Without ``nodes``, ``prefixes`` is that frame."""
        if "r" not in prefixes.columns:
            raise ValueError("predict_flip needs column 'r': the 0/1 reward of the raw trajectory through the prefix")
        check_no_nan(prefixes)
        if prefixes.height == 0:
            return np.zeros(0)
        frame = prefixes
        if nodes is not None:
            rest = nodes.filter(~pl.col("node_id").is_in(prefixes["node_id"].implode()))
            frame = pl.concat([prefixes, rest], how="diagonal_relaxed")
        frame = with_remaining(frame)
        n = prefixes.height
        return self.flip.predict(self.prior_prob(frame)[:n], frame["r"].cast(pl.Float64).fill_null(0.0).to_numpy()[:n],
                                 frame["depth"].fill_null(1).to_numpy()[:n], frame["remaining"].to_numpy()[:n],
                                 frame["tool_errors"].fill_null(0).to_numpy()[:n])  # fmt: skip

    def predict_baselines(self, nodes: pl.DataFrame) -> dict[str, np.ndarray]:
        """Reference predictors, each ``(n,)``: ``constant`` (per-kind mean label of the fit),
        ``history`` (the prompt's own record around that constant) and ``prior`` (the mapped
        hierarchical prior alone, no head)."""
        check_no_nan(nodes)
        if nodes.height == 0:
            return {k: np.zeros(0) for k in ("constant", "history", "prior")}
        roots = is_root(nodes)
        const = np.where(roots, self.base_rate["root"], self.base_rate["prefix"]).astype(np.float64)
        a = self.prior.counts_asof(nodes, self._as_of(nodes))
        kp = self.prior.kappa_prompt
        hist = (kp * self.base_rate["root"] + a["ps"]) / np.maximum(kp + a["pn"], 1e-12)
        return {"constant": const, "history": np.clip(hist, 0.0, 1.0), "prior": self.prior_prob(nodes)}

    # -- persistence (tasks pass paths, not objects) -------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        return save_predictor(self, path)


@register_predictor("hashed_mlp")
def _hashed_mlp(config: PredictorConfig) -> HashedPredictor:
    return HashedPredictor(config)


@register_predictor("hashed_logistic")
def _hashed_logistic(config: PredictorConfig) -> HashedPredictor:
    return HashedPredictor(config.model_copy(update={"model": config.model.model_copy(update={"hidden": 0})}))
