"""The node table: one row per rollout-tree node, its declared schema and the helpers over it.

A node is the state after an agent turn; the root (depth 0) is the prompt itself. A raw
rollout from prompt ``i`` is a chain root -> turn 1 -> ... -> leaf; a prefix extension adds a
new chain below an existing prefix node. Every stage that makes nodes returns a polars
DataFrame with exactly ``NODE_SCHEMA`` (``empty_nodes()`` / ``nodes_frame(rows)``).

A tree is the set of ``NODE_SCHEMA`` rows of one prompt in one iteration; ``parent_id`` links
them. A *trajectory* is one generated chain (``trajectory_id``): a raw rollout root -> leaf, or
an extension prefix node -> leaf. Its training sequence is the root -> leaf path; only its own
turns carry loss (a prefix is trained once, by the trajectory that generated it).

``root_rows`` builds the root rows (the candidate pool and the heads of the rollout trees);
``subtree_stats`` is the one walk from leaves to roots, read by ``finalize_tree`` (the subtree
columns) and by the advantage estimators.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

if TYPE_CHECKING:  # the envs package imports every family's tools (search index, ...)
    from trace_core.envs.base import Task

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
    "policy_version": pl.Int32,  # the weights that generated the node: 0 = the start, i + 1 = after update i
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


@dataclass(frozen=True)
class SubtreeStats:
    """Rewarded leaves below every node of a node table, from one walk; arrays are row-aligned (N,).

    A leaf counts for itself and every ancestor in the table; a node with none below has
    ``count == 0`` and NaN ``mean`` / ``std``. ``std`` is the population std of those rewards.
    """

    ids: list[str]
    parent: dict[str, str | None]  # node id -> parent id (None for roots)
    parent_row: np.ndarray  # (N,) int: row of the parent, -1 for a root or a parent missing from the table
    children: np.ndarray  # (N,) int: rows whose parent is this node
    count: np.ndarray  # (N,) int
    mean: np.ndarray  # (N,) float
    std: np.ndarray  # (N,) float


def subtree_stats(nodes: pl.DataFrame) -> SubtreeStats:
    """Walk each rewarded leaf up to its root once, crediting every ancestor (works on any number of trees)."""
    ids: list[str] = nodes["node_id"].to_list()
    parent = dict(zip(ids, nodes["parent_id"].to_list(), strict=True))
    row = {nid: k for k, nid in enumerate(ids)}
    parent_row = np.array([row.get(parent[i], -1) if parent[i] is not None else -1 for i in ids], dtype=np.int64)
    children = np.bincount(parent_row[parent_row >= 0], minlength=len(ids)).astype(np.int64)
    s1, s2, n = [0.0] * len(ids), [0.0] * len(ids), [0] * len(ids)
    for k, (leaf, reward) in enumerate(zip(nodes["is_leaf"].to_list(), nodes["reward"].to_list(), strict=True)):
        if not leaf or reward is None:
            continue
        r = float(reward)
        cur = k
        while cur >= 0:  # to the root, crediting every ancestor
            s1[cur] += r
            s2[cur] += r * r
            n[cur] += 1
            cur = int(parent_row[cur])
    mean = [s1[k] / n[k] if n[k] else np.nan for k in range(len(ids))]
    std = [float(np.sqrt(max(s2[k] / n[k] - mean[k] ** 2, 0.0))) if n[k] else np.nan for k in range(len(ids))]
    return SubtreeStats(ids, parent, parent_row, children, np.array(n, dtype=np.int64),
                        np.array(mean, dtype=float), np.array(std, dtype=float))


def finalize_tree(nodes: pl.DataFrame, stats: SubtreeStats | None = None) -> pl.DataFrame:
    """Fill ``subtree_mean_reward`` / ``subtree_count`` (leaves with a reward below each node)
    and the trajectories' anchors (``with_anchors``).

    Works on any number of trees at once; nodes without a rewarded leaf below get null / 0.
    ``stats``: ``subtree_stats(nodes)`` if the caller already has it (no second walk).
    """
    st = stats if stats is not None else subtree_stats(nodes)
    return with_anchors(nodes).with_columns(
        pl.Series("subtree_mean_reward", st.mean, dtype=pl.Float64, nan_to_null=True)
        .cast(NODE_SCHEMA["subtree_mean_reward"]),
        pl.Series("subtree_count", st.count, dtype=NODE_SCHEMA["subtree_count"]),
    )


def utc_now() -> datetime:
    """Naive UTC timestamp of the ``created_at`` column."""
    return datetime.now(UTC).replace(tzinfo=None)


def root_rows(run_id: str, iteration: int, strategy: str, tasks: Sequence[Task], *,
              counts: Sequence[int] | None = None, v_pred: Sequence[float] | None = None,
              utility: Sequence[float] | None = None) -> pl.DataFrame:
    """One root row per task (``NODE_SCHEMA``): depth 0, ``origin='root'``, the question in
    ``action_text`` (what the predictors read), id ``node_id(run_id, iteration, prompt_id, 'root')``.

    The same rows score the candidate pool (no ``counts``) and head the rollout trees
    (``counts[i]`` = m_i in ``alloc_children``, with the ``v_pred`` / ``utility`` of that decision).
    """
    for name, col in (("counts", counts), ("v_pred", v_pred), ("utility", utility)):
        if col is not None and len(col) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(col)} {name}")
    now = utc_now()
    return nodes_frame([{
        "run_id": run_id, "strategy": strategy, "iteration": iteration,
        "node_id": node_id(run_id, iteration, t.prompt_id, "root"), "parent_id": None, "prompt_id": t.prompt_id,
        "task": t.family, "difficulty": t.difficulty, "depth": 0, "origin": "root", "action_text": t.question,
        "is_leaf": False, "new_tokens": 0, "tool_errors": 0, "answered": False, "created_at": now,
        "alloc_children": None if counts is None else int(counts[i]),
        "v_pred": None if v_pred is None else float(v_pred[i]),
        "utility": None if utility is None else float(utility[i]),
    } for i, t in enumerate(tasks)])


def with_prefix_decisions(nodes: pl.DataFrame, alloc: pl.DataFrame) -> pl.DataFrame:
    """Copy stage 4's decisions (``v_pred``, K, utility) onto the prefix nodes they were made at."""
    alloc = alloc.select("node_id", pl.col("v_pred").alias("_v"), pl.col("k").alias("_k"),
                         pl.col("utility").alias("_u"))
    return (nodes.join(alloc, on="node_id", how="left")
            .with_columns(pl.coalesce("_v", "v_pred").cast(pl.Float32).alias("v_pred"),
                          pl.coalesce("_k", "alloc_children").cast(pl.Int32).alias("alloc_children"),
                          pl.coalesce("_u", "utility").cast(pl.Float32).alias("utility"))
            .drop("_v", "_k", "_u"))


def path_to_root(node: str, parent: dict[str, str | None]) -> list[str]:
    """Node ids from the root down to ``node`` (inclusive)."""
    path = [node]
    seen = {node}
    while (p := parent.get(path[-1])) is not None:
        if p in seen:
            raise ValueError(f"cycle in the node table at {p}")
        path.append(p)
        seen.add(p)
    return path[::-1]


@dataclass(frozen=True)
class Trajectory:
    """One generated trajectory: its leaf, the root -> leaf path, and which path nodes it made."""

    trajectory_id: str
    prompt_id: str
    path: tuple[str, ...]  # node ids root -> leaf
    own: tuple[bool, ...]  # path[i] was generated by this trajectory (carries loss)


def trajectories(nodes: pl.DataFrame) -> list[Trajectory]:
    """Every trajectory that ends in a leaf, in leaf order of the table."""
    parent = dict(zip(nodes["node_id"].to_list(), nodes["parent_id"].to_list(), strict=True))
    traj_of = dict(zip(nodes["node_id"].to_list(), nodes["trajectory_id"].to_list(), strict=True))
    leaves = nodes.filter(pl.col("is_leaf") & (pl.col("depth") > 0))
    out = []
    for leaf, tid, pid in zip(leaves["node_id"], leaves["trajectory_id"], leaves["prompt_id"], strict=True):
        path = path_to_root(leaf, parent)
        out.append(Trajectory(tid, pid, tuple(path), tuple(traj_of[n] == tid for n in path)))
    return out
