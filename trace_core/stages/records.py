"""The rows one iteration writes beside its nodes: re-verified rewards, the prompts shard, the
predictions shard (each prediction beside the outcome that came after it) and the iteration row."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import polars as pl

from trace_core.envs.base import Task, replay
from trace_core.nodes import trajectories
from trace_core.predictor.base import decision_labels
from trace_core.predictor.evaluation import evaluate_prospective
from trace_core.predictor.prior import outcome_counts


def reverify(nodes: pl.DataFrame, envs: dict, tasks_by_prompt: dict[str, Task]) -> tuple[pl.DataFrame, int]:
    """Replay every trajectory's actions in a fresh environment and take the verifier's reward
    and reason for its leaf. Returns the nodes and how many leaves disagreed with the rollout."""
    rows = {r["node_id"]: r for r in nodes.iter_rows(named=True)}
    fixes: dict[str, tuple[float, str]] = {}
    mismatched = 0
    for traj in trajectories(nodes):
        leaf = rows[traj.path[-1]]
        task = tasks_by_prompt[traj.prompt_id]
        actions = [rows[n]["action_text"] or "" for n in traj.path[1:]]
        _, results = replay(envs[task.family], task, actions)
        last = results[-1] if results else None
        if last is None or not last.done:  # ended by the loop's own limits: keep its reason
            continue
        if leaf["reward"] is None or abs(float(leaf["reward"]) - last.reward) > 1e-6:
            mismatched += 1
        fixes[leaf["node_id"]] = (last.reward, last.reason)
    if not fixes:
        return nodes, mismatched
    fix = pl.DataFrame({"node_id": list(fixes), "_r": [v[0] for v in fixes.values()],
                        "_why": [v[1] for v in fixes.values()]}, schema_overrides={"_r": pl.Float32})
    out = (nodes.join(fix, on="node_id", how="left")
           .with_columns(pl.coalesce("_r", "reward").alias("reward"), pl.coalesce("_why", "reward_reason").alias("reward_reason"))
           .drop("_r", "_why"))
    return out.select(nodes.columns), mismatched


def prompt_rows(prompts: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """The candidate pool with each chosen prompt's raw successes / rollouts."""
    raw_leaves = nodes.filter(pl.col("is_leaf") & (pl.col("origin") == "raw"))
    counts = raw_leaves.group_by("prompt_id").agg(
        (pl.col("reward") > 0.5).sum().cast(pl.Int32).alias("n_success"), pl.len().cast(pl.Int32).alias("n_total"))
    return prompts.join(counts, on="prompt_id", how="left")


def zero_variance_groups(nodes: pl.DataFrame) -> tuple[int, int]:
    """Raw root groups whose rewards all agree (what dynamic sampling replaces): (groups, their trajectories)."""
    g = nodes.filter(pl.col("is_leaf")).group_by("prompt_id").agg(
        pl.col("reward").min().alias("lo"), pl.col("reward").max().alias("hi"), pl.len().alias("n"))
    return (g := g.filter(pl.col("lo") == pl.col("hi"))).height, int(g["n"].sum())


def confirmed_confident_share(prompts: pl.DataFrame, low: float = 0.05, high: float = 0.95) -> float:
    """Share of the root rollouts spent on prompts predicted below ``low`` / above ``high`` that
    came out that way (all failed / all succeeded): the budget the predictor knew was wasted
    (as ``sql/confident_allocation_by_iteration.sql``)."""
    chosen = prompts.filter(pl.col("m_alloc") > 0)
    total = int(chosen["m_alloc"].sum() or 0)
    if total == 0:
        return 0.0
    sure = chosen.filter(((pl.col("v_pred") < low) & (pl.col("n_success") == 0))
                         | ((pl.col("v_pred") > high) & (pl.col("n_success") == pl.col("n_total"))))
    return int(sure["m_alloc"].sum() or 0) / total


def prediction_rows(nodes: pl.DataFrame) -> pl.DataFrame:
    """Predictions made before the outcomes (roots in stage 2, prefixes in stage 4) beside them.
    A root's outcome is its raw rollouts' success rate (what root allocation predicted: the
    continuations below it were chosen by prefix allocation); a prefix's is its subtree mean."""
    y, w = decision_labels(nodes, outcome_counts(nodes))
    labelled = nodes.with_columns(pl.Series("_y", y, dtype=pl.Float32), pl.Series("_w", w, dtype=pl.Float32))
    scored = labelled.filter(pl.col("v_pred").is_not_null() & (pl.col("subtree_count").fill_null(0) > 0)
                             & ((pl.col("depth") == 0) | ~pl.col("is_leaf")))
    return scored.select(
        "run_id", "strategy", "iteration", "node_id", "prompt_id", "task",
        pl.when(pl.col("depth") == 0).then(pl.lit("root")).otherwise(pl.lit("prefix")).alias("kind"),
        "v_pred", pl.col("_y").alias("outcome"), pl.col("_w").alias("weight"))


def prospective_metrics(nodes: pl.DataFrame, predictor) -> dict[str, float]:
    """Brier / AUC / ECE of the predictions made before this iteration's rollouts against the
    outcomes that came after, for roots and prefixes, beside the constant and history baselines."""
    rows = prediction_rows(nodes)
    if rows.height == 0:
        return {}
    base = predictor.predict_baselines(nodes) if hasattr(predictor, "predict_baselines") else {}
    order = {n: i for i, n in enumerate(nodes["node_id"].to_list())}
    idx = np.array([order[n] for n in rows["node_id"]])
    res = evaluate_prospective(rows["v_pred"].to_numpy(), rows["outcome"].to_numpy(), rows["weight"].to_numpy(),
                               rows["kind"].to_numpy(), baselines={k: v[idx] for k, v in base.items()})
    out: dict[str, float] = {}
    for subset in ("root", "prefix"):
        for name, sc in res.get(subset, {}).items():
            if isinstance(sc, dict):
                out.update({f"{subset}_{name}_{m}": float(sc[m]) for m in ("brier", "auc", "ece")
                            if sc.get(m) is not None and np.isfinite(sc[m])})
    return out


def iteration_row(run_id: str, strategy: str, iteration: int, budget_asked: int, results, accuracy) -> dict:
    """The iteration's summary row (budget, tokens, metrics, accuracy, stage timings)."""
    verified = results.verified
    return {
        "run_id": run_id, "strategy": strategy, "iteration": iteration,
        "budget_asked": budget_asked, "budget_used": verified.trajectories,
        "tokens": verified.tokens, "effective_ratio": verified.effective_ratio,
        "wasted_share": verified.wasted_share, "loss": results.update.loss,
        "timings": json.dumps({k: round(float(v), 4) for k, v in results.stage_seconds().items()}),
        "created_at": datetime.now(UTC).replace(tzinfo=None),
        **accuracy.columns(),
    }
