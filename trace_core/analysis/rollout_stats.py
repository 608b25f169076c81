"""The rollout statistics RL users look for beside the effective ratio, named as TRL and verl
name them (README, Tracking): reward mean / std, the share of groups with zero reward variance,
response lengths and the share cut at ``max_new_tokens``, turns per episode, tool-call errors,
and generation throughput. One pure function over an iteration's verified node table."""

from __future__ import annotations

import numpy as np
import polars as pl

TOOL_CALL = "<tool_call>"


def _group_rewards(per: pl.DataFrame, steps: pl.DataFrame) -> list[np.ndarray]:
    """Rewards of every sampling group: the raw rollouts of a prompt (anchor = its root) and the
    continuations from a prefix plus the raw trajectory through it (the effective ratio's groups)."""
    owners = (steps.select(pl.col("node_id").alias("anchor_id"), pl.col("trajectory_id").alias("owner"))
              .join(per.select("anchor_id").unique(), on="anchor_id"))
    members = pl.concat([
        per.select("anchor_id", "reward"),
        owners.join(per.select(pl.col("trajectory_id").alias("owner"), "reward"), on="owner").select("anchor_id", "reward"),
    ]).drop_nulls("reward")
    return [np.asarray(g, dtype=float) for g in members.group_by("anchor_id").agg("reward")["reward"].to_list()]


def rollout_metrics(nodes: pl.DataFrame, *, max_new_tokens: int, seconds: dict[str, float] | None = None
                    ) -> dict[str, float]:
    """Per-iteration statistics of the generated trajectories in ``nodes`` (one iteration, verified).

    * ``reward/mean``, ``reward/std``: over trajectories (TRL ``reward``; its ``reward_std`` is a
      mean of per-group stds);
    * ``reward/frac_zero_std``: share of groups whose rewards are all equal (TRL
      ``frac_reward_zero_std``): what the effective ratio counts in trajectories, in groups;
    * ``response/mean_length``, ``response/max_length``: tokens a trajectory generated (its own
      turns: a continuation pays only for the turns after its prefix); ``response/clipped_ratio``:
      share of trajectories with a turn cut at ``max_new_tokens`` (TRL ``completions/*``);
    * ``episode/turns_mean``, ``episode/turns_max``: agent turns per episode, prefix included
      (verl ``num_turns/*``); ``episode/tool_calls_mean`` and ``episode/tool_error_rate``: tool
      errors per tool call;
    * ``time/<stage>_tokens_per_s`` for the stages named in ``seconds`` (``raw``, ``extensions``).
    """
    steps = nodes.filter((pl.col("depth") >= 1) & pl.col("trajectory_id").is_not_null())
    if steps.height == 0:
        return {}
    per = steps.group_by("trajectory_id").agg(
        pl.col("origin").first(), pl.col("parent_id").sort_by("depth").first().alias("anchor_id"),
        pl.col("reward").filter(pl.col("is_leaf")).max().alias("reward"),
        pl.col("new_tokens").sum().alias("tokens"), pl.col("depth").max().alias("turns"),
        (pl.col("new_tokens") >= max_new_tokens).any().alias("clipped"))
    rewards = per["reward"].drop_nulls().cast(pl.Float64).to_numpy()
    groups = _group_rewards(per, steps)
    # tool errors: the path's running count rises at the turn that made one
    parent_errors = nodes.select(pl.col("node_id").alias("parent_id"), pl.col("tool_errors").alias("parent_errors"))
    turns = steps.join(parent_errors, on="parent_id", how="left").with_columns(
        (pl.col("tool_errors").fill_null(0) - pl.col("parent_errors").fill_null(0)).clip(0).alias("new_errors"),
        pl.col("action_text").fill_null("").str.contains(TOOL_CALL, literal=True).alias("tool_call"))
    calls = int(turns["tool_call"].sum())
    out = {
        "reward/mean": float(rewards.mean()) if rewards.size else None,
        "reward/std": float(rewards.std()) if rewards.size else None,
        "reward/frac_zero_std": float(np.mean([g.max() == g.min() for g in groups])) if groups else None,
        "response/mean_length": float(per["tokens"].mean()), "response/max_length": float(per["tokens"].max()),
        "response/clipped_ratio": float(per["clipped"].mean()),
        "episode/turns_mean": float(per["turns"].mean()), "episode/turns_max": float(per["turns"].max()),
        "episode/tool_calls_mean": calls / per.height,
        "episode/tool_error_rate": float(turns["new_errors"].sum()) / calls if calls else None,
    }
    for stage, origin in (("raw", "raw"), ("extensions", "extension")):
        secs = (seconds or {}).get(stage)
        if secs:
            out[f"time/{stage}_tokens_per_s"] = float(steps.filter(pl.col("origin") == origin)["new_tokens"].sum()) / secs
    return {k: v for k, v in out.items() if v is not None}
