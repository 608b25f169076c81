"""Trajectory metrics on plain arrays: effective ratio, waste, tokens, gradient energy.

Input layout (one row per *membership* of a trajectory in a group)::

    group      (R,)  group id: the anchor node whose children are compared (root or prefix)
    reward     (R,)  the trajectory's reward
    trajectory (R,)  trajectory id; optional (default: every row its own trajectory). A raw
                     rollout that also anchors a prefix group appears once per group.
    tokens     (R,)  generated tokens of the row's trajectory (counted once per trajectory)

A trajectory is *effective* when, in at least one of its groups, its reward differs from the
group mean, i.e. it receives a non-zero group-relative advantage. With 0/1 rewards that is
"its group has mixed rewards". Ids may be any numpy-sortable values (ints, strings).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.utility import prefix_utility, root_utility

_EPS = 1e-9


def _arrays(group, reward, trajectory=None):
    g = np.asarray(group)
    r = np.asarray(reward, dtype=np.float64)
    if g.ndim != 1 or r.shape != g.shape:
        raise ValueError(f"group and reward must be 1-D of one length, got {g.shape} and {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError("reward must be finite")
    t = np.arange(g.shape[0]) if trajectory is None else np.asarray(trajectory)
    if t.shape != g.shape:
        raise ValueError(f"trajectory must have the shape of group {g.shape}, got {t.shape}")
    return g, r, t


def advantages(group, reward) -> np.ndarray:
    """(R,) group-relative advantage ``r - mean(group)`` (no std scaling)."""
    g, r, _ = _arrays(group, reward)
    if g.size == 0:
        return np.zeros(0)
    _, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
    mean = np.bincount(inv, weights=r) / counts
    return r - mean[inv]


def effective_mask(group, reward, trajectory=None) -> tuple[np.ndarray, np.ndarray]:
    """(trajectory ids (T,), effective (T,) bool), ids sorted as ``np.unique`` sorts them."""
    g, r, t = _arrays(group, reward, trajectory)
    ids, tinv = np.unique(t, return_inverse=True)
    if g.size == 0:
        return ids, np.zeros(0, dtype=bool)
    nonzero = np.abs(advantages(g, r)) > _EPS
    eff = np.zeros(ids.shape[0], dtype=bool)
    np.logical_or.at(eff, tinv, nonzero)
    return ids, eff


def effective_ratio(group, reward, trajectory=None) -> float:
    """Share of generated trajectories that receive a non-zero advantage (0.0 when empty)."""
    _, eff = effective_mask(group, reward, trajectory)
    return float(eff.mean()) if eff.size else 0.0


def wasted_trajectories(group, reward, trajectory=None) -> int:
    """Trajectories whose every group is zero-contrast: generated, but no gradient signal."""
    _, eff = effective_mask(group, reward, trajectory)
    return int((~eff).sum())


def effective_per_1k_tokens(group, reward, tokens, trajectory=None) -> float:
    """Effective trajectories per 1,000 generated tokens (each trajectory's tokens counted once)."""
    g, r, t = _arrays(group, reward, trajectory)
    tok = np.asarray(tokens, dtype=np.float64)
    if tok.shape != g.shape:
        raise ValueError(f"tokens must have the shape of group {g.shape}, got {tok.shape}")
    ids, first = np.unique(t, return_index=True)
    total = tok[first].sum()
    _, eff = effective_mask(g, r, t)
    return float(1000.0 * eff.sum() / total) if total > 0 else 0.0


def gradient_energy(group, reward, trajectory=None) -> float:
    """Gradient-energy proxy per generated trajectory: ``sum_rows (r - mean_group)^2 / T``.

    With a per-token policy-gradient norm roughly constant, ``sum A^2`` is the squared signal
    the batch carries; a zero-contrast group contributes nothing.
    """
    g, r, t = _arrays(group, reward, trajectory)
    n_traj = np.unique(t).size
    return float((advantages(g, r) ** 2).sum() / n_traj) if n_traj else 0.0


# ----------------------------------------------------------------------------- expectations
def expected_root_effective(v, m) -> tuple[float, float]:
    """(expected effective trajectories, trajectories) of root groups of ``m_i`` rollouts with
    true success probabilities ``v_i``: a group is all-effective with probability V_root."""
    v, m = np.asarray(v, dtype=float), np.asarray(m)
    return float((m * root_utility(v, m)).sum()), float(m.sum())


def expected_prefix_effective(v, r, k) -> tuple[float, float]:
    """(expected effective continuations, continuations) for ``k_i`` continuations from prefixes
    with true success probability ``v_i`` on a rollout of reward ``r_i`` (the rollout itself is
    counted with its root group, not here)."""
    k = np.asarray(k)
    return float((k * prefix_utility(v, r, k)).sum()), float(k.sum())


def expected_effective_ratio(v, m) -> float:
    """Expected effective ratio of root groups (``expected_root_effective`` as a share)."""
    eff, n = expected_root_effective(v, m)
    return eff / n if n else 0.0


def expected_wasted(v, m) -> float:
    """Expected trajectories in zero-contrast root groups: ``sum m_i (1 - V_root(v_i, m_i))``."""
    eff, n = expected_root_effective(v, m)
    return n - eff


def trajectory_table(nodes: pl.DataFrame) -> pl.DataFrame:
    """One row per generated trajectory of a verified node table, with the effective flag.

    A trajectory's *anchor* is the node it branched from: the prompt's root for a raw rollout,
    the prefix node for a continuation. Groups are anchors: a root group (the raw rollouts of one
    prompt in one iteration) or a branch group (the continuations from one prefix plus the raw
    trajectory through that prefix, its *owner*). A trajectory is effective when a group it
    belongs to holds both outcomes; tokens are its own generated tokens (a continuation pays only
    for the turns after its prefix). The SQL view ``trajectories`` uses the same definition.
    """
    cols = ["iteration", "trajectory_id", "prompt_id", "origin", "anchor_id", "reward", "tokens", "effective"]
    steps = nodes.filter((pl.col("depth") >= 1) & pl.col("trajectory_id").is_not_null())
    if steps.height == 0:
        return pl.DataFrame(schema={c: nodes.schema.get(c, pl.Utf8) for c in cols[:4]} | {
            "anchor_id": pl.Utf8, "reward": pl.Float32, "tokens": pl.Int64, "effective": pl.Boolean})
    per = steps.group_by("iteration", "trajectory_id").agg(
        pl.col("prompt_id").first(), pl.col("origin").first(),
        pl.col("parent_id").sort_by("depth").first().alias("anchor_id"),
        pl.col("reward").filter(pl.col("is_leaf")).max().alias("reward"),
        pl.col("new_tokens").sum().cast(pl.Int64).alias("tokens"))
    owners = (steps.select("iteration", pl.col("node_id").alias("anchor_id"), pl.col("trajectory_id").alias("owner"))
              .join(per.select("iteration", "anchor_id").unique(), on=["iteration", "anchor_id"]))
    members = pl.concat([
        per.select("iteration", "anchor_id", "reward"),
        owners.join(per.select("iteration", pl.col("trajectory_id").alias("owner"), "reward"), on=["iteration", "owner"])
        .select("iteration", "anchor_id", "reward"),
    ])
    groups = members.group_by("iteration", "anchor_id").agg(
        (pl.col("reward").max() > pl.col("reward").min()).fill_null(False).alias("contrastive"))
    owns = (owners.join(groups.filter(pl.col("contrastive")), on=["iteration", "anchor_id"])
            .select("iteration", pl.col("owner").alias("trajectory_id")).unique().with_columns(pl.lit(True).alias("_own")))
    return (per.join(groups, on=["iteration", "anchor_id"], how="left")
            .join(owns, on=["iteration", "trajectory_id"], how="left")
            .with_columns((pl.col("contrastive").fill_null(False) | pl.col("_own").fill_null(False)).alias("effective"))
            .select(cols).sort("iteration", "trajectory_id"))


def trajectory_metrics(nodes: pl.DataFrame) -> dict:
    """Effective ratio, waste, tokens and train reward of a verified node table
    (``trajectory_table`` says what counts as effective)."""
    per = trajectory_table(nodes)
    n, eff = per.height, int(per["effective"].sum() or 0) if per.height else 0
    tokens = int(per["tokens"].sum() or 0) if per.height else 0
    leaves = nodes.filter(pl.col("is_leaf"))
    return {"trajectories": n, "effective": eff, "wasted": n - eff, "tokens": tokens,
            "effective_ratio": eff / n if n else 0.0, "wasted_share": (n - eff) / n if n else 0.0,
            "effective_per_1k_tokens": 1000.0 * eff / tokens if tokens else 0.0,
            "train_reward": float(leaves["reward"].mean() or 0.0) if leaves.height else 0.0}
