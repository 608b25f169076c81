"""One TRACE iteration, stages 6-7 and the record: verify rewards, compute advantages and
metrics, update the policy, evaluate held-out accuracy, write the iteration's rows."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import torch

from trace_core.advantage import compute_advantages
from trace_core.config import TrainConfig
from trace_core.envs.base import replay
from trace_core.metrics import trajectory_metrics
from trace_core.rollout_nodes import finalize_tree, trajectories
from trace_core.runtime import RunRef, candidate_pool, heldout_pool, iteration_seed, load_policy_for
from trace_core.shards import ShardWriter, read_shard
from trace_core.strategies import get_strategy


def reverify(nodes: pl.DataFrame, envs: dict, tasks_by_prompt: dict) -> tuple[pl.DataFrame, int]:
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


def verify(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, predictor: dict, roots: dict,
           raw: dict, scored: dict, ext: dict) -> dict:
    """Stage 6: re-verify rewards, fill subtree rewards, prefix decisions and advantages;
    write the iteration's node, prompt and prediction shards (the rows behind the views)."""
    t0 = time.perf_counter()
    pol = load_policy_for(cfg, checkpoint)
    tasks = {t.prompt_id: t for t in candidate_pool(cfg, iteration)}
    nodes = pl.concat([read_shard(raw["raw"]), read_shard(ext["extensions"])], how="vertical_relaxed")
    nodes, mismatched = reverify(nodes, pol.envs, tasks)
    alloc = read_shard(scored["prefix_alloc"]).select(
        "node_id", pl.col("v_pred").alias("_v"), pl.col("k").alias("_k"), pl.col("utility").alias("_u"))
    nodes = (nodes.join(alloc, on="node_id", how="left")
             .with_columns(pl.coalesce("_v", "v_pred").cast(pl.Float32).alias("v_pred"),
                           pl.coalesce("_k", "alloc_children").cast(pl.Int32).alias("alloc_children"),
                           pl.coalesce("_u", "utility").cast(pl.Float32).alias("utility"))
             .drop("_v", "_k", "_u"))
    nodes = compute_advantages(finalize_tree(nodes), cfg.advantage)
    writer = ShardWriter(ref.home, ref.run_id, strategy=cfg.allocation.strategy)
    writer.write("nodes", nodes, stage="final", iteration=iteration)
    writer.write("prompts", _prompt_rows(read_shard(roots["prompts"]), nodes), stage="final", iteration=iteration)
    writer.write("predictions", _prediction_rows(nodes), stage="final", iteration=iteration)
    met = trajectory_metrics(nodes)
    met["predictor_metrics"] = prospective_metrics(nodes, torch.load(predictor["predictor"], weights_only=False))
    met.update(reward_mismatches=mismatched, seconds=time.perf_counter() - t0,
               nodes=str(writer.path("nodes", stage="final", iteration=iteration)))
    return met


def prospective_metrics(nodes: pl.DataFrame, predictor) -> dict[str, float]:
    """Brier / AUC / ECE of the predictions made before this iteration's rollouts against the
    outcomes that came after, for roots and prefixes, beside the constant and history baselines."""
    from trace_core.predictor.evaluation import evaluate_prospective

    rows = _prediction_rows(nodes)
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


def _prompt_rows(prompts: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    raw_leaves = nodes.filter(pl.col("is_leaf") & (pl.col("origin") == "raw"))
    counts = raw_leaves.group_by("prompt_id").agg(
        (pl.col("reward") > 0.5).sum().cast(pl.Int32).alias("n_success"), pl.len().cast(pl.Int32).alias("n_total"))
    return prompts.join(counts, on="prompt_id", how="left")


def _prediction_rows(nodes: pl.DataFrame) -> pl.DataFrame:
    """Predictions made before the outcomes (roots in stage 2, prefixes in stage 4) beside them."""
    scored = nodes.filter(pl.col("v_pred").is_not_null() & (pl.col("subtree_count").fill_null(0) > 0)
                          & ((pl.col("depth") == 0) | ~pl.col("is_leaf")))
    return scored.select(
        "run_id", "strategy", "iteration", "node_id", "prompt_id", "task",
        pl.when(pl.col("depth") == 0).then(pl.lit("root")).otherwise(pl.lit("prefix")).alias("kind"),
        "v_pred", pl.col("subtree_mean_reward").alias("outcome"), pl.col("subtree_count").cast(pl.Float32).alias("weight"))


def update(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, verified: dict) -> dict:
    """Stage 7: one clipped-surrogate update on the iteration's trees; save the next checkpoint."""
    from trace_core.policy.checkpoint import STATE_FILE, load_checkpoint, save_checkpoint
    from trace_core.policy.update import build_sequences, make_optimizer, update_policy

    t0 = time.perf_counter()
    pol = load_policy_for(cfg, checkpoint)
    nodes = read_shard(verified["nodes"])
    tasks = {t.prompt_id: t for t in candidate_pool(cfg, iteration)}
    messages = {p: pol.envs[tasks[p].family].reset(tasks[p]).messages() for p in nodes["prompt_id"].unique()}
    skip = get_strategy(cfg.allocation.strategy).drop_zero_variance or cfg.update.skip_zero_advantage
    seqs = build_sequences(nodes, pol.chat, messages, skip_zero_advantage=skip)
    optimizer, scheduler = make_optimizer(pol.model, cfg.update)
    if (Path(checkpoint) / STATE_FILE).is_file():  # continue the optimizer of the last update
        load_checkpoint(checkpoint, pol.model, optimizer=optimizer, scheduler=scheduler, restore_rng=False)
    torch.manual_seed(iteration_seed(cfg, iteration, "update") % (2**31))
    pol.engine.sleep()  # a colocated vLLM engine frees the GPU for the trainer; a no-op for hf
    stats = update_policy(pol.model, optimizer, scheduler, seqs, cfg.update, pad_id=pol.tokenizer.pad_token_id,
                          seed=iteration_seed(cfg, iteration, "update"))
    out = ref.checkpoint(iteration)
    save_checkpoint(out, pol.model, optimizer=optimizer, scheduler=scheduler, tokenizer=pol.tokenizer,
                    cursor={"iteration": iteration + 1})
    pol.engine.wake()  # the next stage loads the new weights into it (runtime.load_policy_for)
    return {"checkpoint": str(out), **{k: float(v) for k, v in stats.items()}, "seconds": time.perf_counter() - t0}


def evaluate(cfg: TrainConfig, checkpoint: str) -> dict:
    """Held-out accuracy (mean sampled reward) per family and overall."""
    from trace_core.policy.evaluate import sample_rewards

    t0 = time.perf_counter()
    tasks = heldout_pool(cfg)
    if not tasks or cfg.run.eval_tasks == 0:
        return {}
    pol = load_policy_for(cfg, checkpoint)
    rewards = sample_rewards(pol.model, pol.tokenizer, tasks, cfg.run.eval_samples, seed=cfg.run.seed,
                             temperature=cfg.sampling.temperature, max_new_tokens=cfg.sampling.max_new_tokens,
                             env_kwargs=cfg.env.model_dump())
    fam = np.array([t.family for t in tasks])
    out = {"accuracy": float(rewards.mean())}
    for f in sorted(set(fam)):
        out[f"accuracy_{f}"] = float(rewards[fam == f].mean())
    out["seconds"] = time.perf_counter() - t0
    return out


def record_iteration(ref: RunRef, cfg: TrainConfig, iteration: int, results: dict[str, dict], accuracy: dict) -> dict:
    """Write the iteration's summary row (budget, tokens, metrics, accuracy, stage timings)."""
    verified, upd = results["verify"], results["update"]
    row = {
        "run_id": ref.run_id, "strategy": cfg.allocation.strategy, "iteration": iteration,
        "budget_asked": cfg.allocation.budget_total, "budget_used": int(verified["trajectories"]),
        "tokens": int(verified["tokens"]), "effective_ratio": verified["effective_ratio"],
        "wasted_share": verified["wasted_share"], "loss": upd.get("loss"),
        "timings": json.dumps({k: round(float(v.get("seconds", 0.0)), 4) for k, v in results.items()}),
        "created_at": datetime.now(UTC).replace(tzinfo=None),
        **{k: v for k, v in accuracy.items() if k.startswith("accuracy")},
    }
    ShardWriter(ref.home, ref.run_id).write("iterations", pl.DataFrame([row]), stage="final", iteration=iteration)
    return row
