"""The history shift of a root (``predictor.history_shift``): a prompt's record re-weighted to the
policy that will sample it.

A prompt's earlier raw trajectories were sampled by older weights. Weighted by
``w = (π_now(τ) / π_then(τ)) ** alpha`` -- one forward pass of the stored trajectory under the
checkpoint the rollouts use, against the behaviour log-probs stored with every node -- their mean
reward estimates the success rate under the current weights without sampling (self-normalised
importance sampling; ``alpha`` < 1 tempers the weights of long sequences). Where the record holds both
outcomes the estimate differs from the plain record; the shift's feature is that difference in
logits, ``d = logit(snis) - logit(record)``, and the prediction's logit moves by ``beta * d``.
Where the record is all one outcome the weights cannot move it (``d = 0``).

``beta`` is a one-parameter logistic regression with the prediction before the shift as offset, on
the run's earlier sampled roots that carried a feature (``prompts.is_shift``, ``v_unshifted``,
``n_success / n_total``): every fitting row is a prospective prediction. Measured on a GRPO-4 run of
``configs/learning-epochs-192.yaml`` (``benchmarks/learning/history_is_probe.py``): the feature
correlates +0.30 with the predictor's residual (the step's rate minus ``v_pred``), and the slope fitted
on steps 1-11 lowered the binomial log-loss of steps 12-19 from 0.2828 to 0.2775.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from trace_core.config import TrainConfig
from trace_core.envs.base import Task
from trace_core.policy.update import build_sequences, collate, token_logprobs
from trace_core.predictor.calibration import logit, sigmoid
from trace_core.predictor.config import HistoryShiftConfig
from trace_core.stages.history import history_nodes, history_prompts
from trace_core.stages.run import RunRef
from trace_core.stages.versions import rollout_version

EPS = 0.02  # rates are clipped to [EPS, 1 - EPS] before the logit: a record of 8 is never certain


def _logit(p: np.ndarray) -> np.ndarray:
    return logit(np.clip(p, EPS, 1 - EPS))


def recent_raw(history: pl.DataFrame, prompt_ids: list[str], max_trajectories: int) -> pl.DataFrame:
    """The nodes of each prompt's ``max_trajectories`` most recent raw trajectories in ``history``,
    for the prompts whose kept record holds both outcomes (the only ones a weight can move)."""
    leaves = (history.filter(pl.col("is_leaf") & (pl.col("origin") == "raw") & (pl.col("depth") > 0)
                             & pl.col("prompt_id").is_in(prompt_ids))
              .sort("iteration", "trajectory_id", descending=[True, False])
              .group_by("prompt_id", maintain_order=True).head(max_trajectories))
    mixed = leaves.group_by("prompt_id").agg((pl.col("reward") > 0.5).mean().alias("rate")).filter(
        (pl.col("rate") > 0) & (pl.col("rate") < 1))["prompt_id"]
    keep = leaves.filter(pl.col("prompt_id").is_in(mixed.implode()))["trajectory_id"]
    return history.filter(pl.col("trajectory_id").is_in(keep.implode()) | ((pl.col("origin") == "root")
                                                                 & pl.col("prompt_id").is_in(mixed.implode())))


@torch.no_grad()
def log_weights(model, seqs, pad_id: int, temperature: float, batch: int = 64) -> np.ndarray:
    """``(n,)`` Σ over each sequence's action tokens of ``log π_model − log π_behaviour``."""
    out = np.zeros(len(seqs))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].input_ids))  # little padding
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    try:
        for s in range(0, len(order), batch):
            rows = order[s:s + batch]
            b = collate([seqs[i] for i in rows], pad_id, device)
            lp = token_logprobs(model, b, temperature)
            out[rows] = ((lp - b["old_logprobs"]) * b["loss_mask"]).sum(1).cpu().numpy()
    finally:
        model.train(was_training)
    return out


def shift_features(policy, history: pl.DataFrame, prompt_ids: list[str], messages: dict, cfg: HistoryShiftConfig,
                   temperature: float) -> np.ndarray:
    """``(C,)`` the feature ``d`` per candidate: NaN without a raw record, 0 where the record is all one
    outcome, else the tempered self-normalised estimate's logit minus the record's (bounded)."""
    d = np.full(len(prompt_ids), np.nan)
    has = set(history.filter(pl.col("is_leaf") & (pl.col("origin") == "raw"))["prompt_id"].to_list())
    d[[i for i, p in enumerate(prompt_ids) if p in has]] = 0.0
    nodes = recent_raw(history, [p for p in prompt_ids if p in has], cfg.max_trajectories)
    if not nodes.height:
        return d
    seqs = build_sequences(nodes, policy.chat, messages, skip_zero_advantage=False)
    logw = cfg.alpha * log_weights(policy.model, seqs, policy.tokenizer.pad_token_id, temperature)
    leaf = {r["trajectory_id"]: r for r in nodes.filter(pl.col("is_leaf") & (pl.col("depth") > 0))
            .select("trajectory_id", "prompt_id", "reward").iter_rows(named=True)}
    frame = pl.DataFrame({"prompt_id": [leaf[s.trajectory_id]["prompt_id"] for s in seqs], "logw": logw,
                          "r": [float(leaf[s.trajectory_id]["reward"] > 0.5) for s in seqs]})
    frame = frame.with_columns((pl.col("logw") - pl.col("logw").max().over("prompt_id")).exp().alias("w"))
    est = frame.group_by("prompt_id").agg(pl.col("r").mean().alias("record"),
                                          ((pl.col("w") * pl.col("r")).sum() / pl.col("w").sum()).alias("snis"))
    shift = np.clip(_logit(est["snis"].to_numpy()) - _logit(est["record"].to_numpy()), -cfg.max_shift, cfg.max_shift)
    at = {p: i for i, p in enumerate(prompt_ids)}
    d[[at[p] for p in est["prompt_id"].to_list()]] = shift
    return d


def fit_slope(rows: pl.DataFrame, cfg: HistoryShiftConfig) -> tuple[float, int]:
    """``(beta, rows used)``: the L2-penalised logistic slope of the outcomes on ``is_shift`` with
    ``logit(v_unshifted)`` as offset; 0 below ``min_rows`` rows with a non-zero feature."""
    rows = rows.filter(pl.col("is_shift").is_not_null() & (pl.col("is_shift") != 0) & (pl.col("n_total") > 0)
                       & pl.col("v_unshifted").is_not_null())
    if rows.height < cfg.min_rows:
        return 0.0, rows.height
    x, z = rows["is_shift"].to_numpy().astype(float), _logit(rows["v_unshifted"].to_numpy().astype(float))
    s, n = rows["n_success"].to_numpy().astype(float), rows["n_total"].to_numpy().astype(float)
    beta = 0.0
    for _ in range(25):  # Newton on one parameter
        p = sigmoid(z + beta * x)
        step = ((x * (n * p - s)).sum() + cfg.l2 * beta) / ((x * x * n * p * (1 - p)).sum() + cfg.l2)
        beta -= step
        if abs(step) < 1e-8:
            break
    return float(beta), rows.height


def earlier_roots(ref: RunRef, before: int) -> pl.DataFrame:
    """The sampled roots of iterations ``< before`` with their feature, prediction before the shift
    and outcome (shards from before the shift have no feature)."""
    cols = ["is_shift", "v_unshifted", "n_success", "n_total"]
    rows = history_prompts(ref, before)
    if not set(cols) <= set(rows.columns):
        return pl.DataFrame(schema=dict.fromkeys(cols, pl.Float64))
    return rows.filter(pl.col("m_alloc") > 0).select(cols)


def shifted(v: np.ndarray, d: np.ndarray, beta: float) -> np.ndarray:
    """``v`` with each logit moved by ``beta * d`` (rows with NaN or 0 ``d`` unchanged)."""
    v = np.asarray(v, dtype=np.float64)
    if beta == 0:
        return v.copy()
    z = _logit(v) + beta * np.nan_to_num(d, nan=0.0)
    return np.where(np.isnan(d) | (d == 0), v, sigmoid(z))


def history_shift(ref: RunRef, cfg: TrainConfig, iteration: int, v: np.ndarray, tasks: list[Task], policy,
                  envs: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """Stage 2's side: ``(shifted v, feature d per candidate, beta)`` under ``policy``, the
    checkpoint the rollouts use; the record is what the plan may read (``history_nodes``)."""
    hcfg = cfg.predictor.history_shift
    history = history_nodes(ref, iteration, max_version=rollout_version(iteration, cfg.run.max_staleness))
    if not history.height:
        return v, np.full(len(tasks), np.nan), 0.0
    ids = [t.prompt_id for t in tasks]
    seen = set(history["prompt_id"].unique().to_list())
    messages = {t.prompt_id: envs[t.family].reset(t).messages() for t in tasks if t.prompt_id in seen}
    d = shift_features(policy, history, ids, messages, hcfg, cfg.sampling.temperature)
    beta, _ = fit_slope(earlier_roots(ref, iteration), hcfg)
    return shifted(v, d, beta), d, beta
