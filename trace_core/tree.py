"""Rollout-tree data model: one row per node, with a declared Arrow/polars schema.

A node is the state after an agent turn; the root (depth 0) is the prompt itself. A raw
rollout from prompt ``i`` is a chain root -> turn 1 -> ... -> leaf; a prefix extension adds a
new chain below an existing prefix node. Every stage that makes nodes returns a polars
DataFrame with exactly ``NODE_SCHEMA`` (``empty_nodes()`` / ``nodes_frame(rows)``).
"""

from __future__ import annotations

import hashlib

import polars as pl

NODE_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "iteration": pl.Int32,
    "node_id": pl.Utf8,  # deterministic: hash of (run, iteration, prompt, path)
    "parent_id": pl.Utf8,  # None for roots
    "prompt_id": pl.Utf8,
    "trajectory_id": pl.Utf8,  # the generated trajectory this node's turn belongs to
    "task": pl.Utf8,  # task family: math | qa | fc
    "difficulty": pl.Int32,
    "depth": pl.Int32,  # turn index; 0 = root (prompt)
    "origin": pl.Utf8,  # 'root' | 'raw' | 'extension'
    "anchor_id": pl.Utf8,  # the node this node's trajectory branched from (the root for raw rollouts); None for roots
    "anchor_trajectory_id": pl.Utf8,  # the trajectory through the anchor (None when the anchor is the root)
    "action_text": pl.Utf8,
    "observation_text": pl.Utf8,
    "action_token_ids": pl.List(pl.Int32),
    "action_logprobs": pl.List(pl.Float32),
    "new_tokens": pl.Int32,  # tokens generated for this turn
    "is_leaf": pl.Boolean,
    "reward": pl.Float32,  # leaves only
    "reward_reason": pl.Utf8,  # leaves only: verifier reason code
    "subtree_mean_reward": pl.Float32,
    "subtree_count": pl.Int32,  # leaves below (the weight of subtree_mean_reward)
    "v_pred": pl.Float32,  # predicted success probability, made before the outcome
    "alloc_children": pl.Int32,  # m (roots) or K (prefixes) decided here
    "utility": pl.Float32,  # V_root or V_pref of that decision
    "advantage": pl.Float32,
    "mean_logprob": pl.Float32,  # policy signal up to this node
    "min_logprob": pl.Float32,
    "tool_errors": pl.Int32,  # tool errors seen on the path so far
    "answered": pl.Boolean,  # a final answer was given at this node
    "gen_seconds": pl.Float32,
    "created_at": pl.Datetime("us"),
}


def empty_nodes() -> pl.DataFrame:
    return pl.DataFrame(schema=NODE_SCHEMA)


def nodes_frame(rows: list[dict]) -> pl.DataFrame:
    """Rows (dicts, missing keys -> null) as a frame with exactly NODE_SCHEMA."""
    if not rows:
        return empty_nodes()
    full = [{k: r.get(k) for k in NODE_SCHEMA} for r in rows]
    return pl.DataFrame(full, schema=NODE_SCHEMA)


def with_anchors(nodes: pl.DataFrame) -> pl.DataFrame:
    """``nodes`` with ``anchor_id`` / ``anchor_trajectory_id`` filled from the parent links.

    A trajectory's anchor is the parent of its first (shallowest) node: the prompt's root for a
    raw rollout, the prefix node for a continuation; every node of the trajectory carries it, so
    the store groups trajectories by anchor in one pass. ``anchor_trajectory_id`` is the
    trajectory through the anchor (the raw rollout a continuation contrasts with). Both need the
    anchor's tree in ``nodes`` (one iteration's trees: the flow's final shard holds them).
    """
    scope = [c for c in ("run_id", "iteration") if c in nodes.columns]  # ids are unique within these
    steps = nodes.filter(pl.col("trajectory_id").is_not_null() & (pl.col("depth") > 0))
    anchors = steps.group_by(*scope, "trajectory_id").agg(
        pl.col("parent_id").sort_by("depth").first().alias("anchor_id"))
    through = nodes.select(*scope, pl.col("node_id").alias("anchor_id"),
                           pl.col("trajectory_id").alias("anchor_trajectory_id")).unique([*scope, "anchor_id"])
    anchors = anchors.join(through, on=[*scope, "anchor_id"], how="left", nulls_equal=True)
    out = (nodes.drop("anchor_id", "anchor_trajectory_id", strict=False)
           .join(anchors, on=[*scope, "trajectory_id"], how="left", maintain_order="left", nulls_equal=True)
           .with_columns(pl.col("anchor_id", "anchor_trajectory_id").cast(pl.Utf8)))
    return out.select(sorted(out.columns, key=lambda c: list(NODE_SCHEMA).index(c) if c in NODE_SCHEMA else 999))


def node_id(*parts: object) -> str:
    """Deterministic 16-hex id from the parts that place a node in a run."""
    h = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8)
    return h.hexdigest()
