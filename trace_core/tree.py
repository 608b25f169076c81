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


def node_id(*parts: object) -> str:
    """Deterministic 16-hex id from the parts that place a node in a run."""
    h = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8)
    return h.hexdigest()
