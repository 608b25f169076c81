"""Advantage estimators over the node table: pure, registered functions (verl-style).

Every estimator maps a node table and its ``SubtreeStats`` (one walk, shared with
``finalize_tree``) to one advantage per node. The advantage of a node is the advantage of *the
turn that produced it*: every action token of that turn gets it (``policy.update`` spreads it
over the tokens). Roots get null.

* ``grpo``: the leaves of one prompt form the group; ``A(node) = mean reward below node − mean
  reward of the prompt`` (optionally / std of the prompt's rewards). On an unbranched tree every
  turn of rollout ``j`` gets ``r_j − mean(r)``, which is GRPO.
* A node's value (both estimators) is the mean reward of every leaf below it. On a branched tree
  that counts a branched child K + 1 times in its root group's baseline (the mean of the
  children's values instead was measured and learned less).
* ``tree``: the anchor of a turn is the nearest ancestor with more than one child (a branch
  point: the root with ``m ≥ 2`` rollouts, or a prefix with its continuations plus the original
  continuation). ``A(node) = mean reward below node − mean reward below anchor`` (optionally /
  std of the rewards below the anchor). Without extensions it equals ``grpo``; a turn with no
  branch point above it (a prompt sampled once) gets 0: nothing to contrast it with.

Usage::

    nodes = compute_advantages(nodes, AdvantageConfig(estimator="tree"))  # subtree columns filled too
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from trace_core.advantages.config import AdvantageConfig
from trace_core.nodes import NODE_SCHEMA, SubtreeStats, finalize_tree, subtree_stats
from trace_core.registry import Registry

#: ``fn(nodes, stats, cfg) -> (N,)`` float advantages, NaN = none (roots). ``nodes`` has its
#: subtree columns filled; ``stats`` is ``subtree_stats(nodes)`` (row-aligned arrays).
Estimator = Callable[[pl.DataFrame, SubtreeStats, AdvantageConfig], np.ndarray]
_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register_adv_est(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator registering an estimator ``fn(nodes, stats, cfg) -> float array, one per row (NaN = none)``."""
    return _ESTIMATORS.register(name)


def get_adv_est(name: str) -> Estimator:
    return _ESTIMATORS.get_item(name)


def adv_est_names() -> list[str]:
    """The registered estimator names, sorted."""
    return _ESTIMATORS.names()


def compute_advantages(nodes: pl.DataFrame, cfg: AdvantageConfig | None = None) -> pl.DataFrame:
    """``nodes`` with ``subtree_mean_reward`` / ``subtree_count`` and ``advantage`` filled by
    ``cfg.estimator``; the subtree walk runs once, here (no ``finalize_tree`` needed before)."""
    cfg = cfg or AdvantageConfig()
    est = get_adv_est(cfg.estimator)
    stats = subtree_stats(nodes)
    nodes = finalize_tree(nodes, stats)
    adv = est(nodes, stats, cfg)
    return nodes.with_columns(pl.Series("advantage", adv, dtype=NODE_SCHEMA["advantage"], nan_to_null=True))


def _relative(st: SubtreeStats, k: int, anchor: int, cfg: AdvantageConfig) -> float:
    """Mean reward below row ``k`` minus that below row ``anchor`` (0 without an anchor or rewards)."""
    if anchor < 0 or np.isnan(st.mean[k]) or np.isnan(st.mean[anchor]):
        return 0.0
    a = float(st.mean[k] - st.mean[anchor])
    return a / (float(st.std[anchor]) + cfg.eps) if cfg.scale_std else a


@register_adv_est("grpo")
def grpo_advantage(nodes: pl.DataFrame, st: SubtreeStats, cfg: AdvantageConfig) -> np.ndarray:
    """Group = all leaves of the prompt's root. Returns (N,) with NaN for roots."""
    out = np.full(len(st.ids), np.nan)
    for k, nid in enumerate(st.ids):
        if st.parent[nid] is None:
            continue
        root = k
        while st.parent_row[root] >= 0:
            root = int(st.parent_row[root])
        grouped = st.parent[st.ids[root]] is None and st.children[root] > 1  # a root with >= 2 rollouts
        out[k] = _relative(st, k, root if grouped else -1, cfg)
    return out


@register_adv_est("tree")
def tree_advantage(nodes: pl.DataFrame, st: SubtreeStats, cfg: AdvantageConfig) -> np.ndarray:
    """Anchor = nearest ancestor with > 1 child. Returns (N,) with NaN for roots."""
    out = np.full(len(st.ids), np.nan)
    for k, nid in enumerate(st.ids):
        if st.parent[nid] is None:
            continue
        anchor = int(st.parent_row[k])
        while anchor >= 0 and st.children[anchor] < 2:
            anchor = int(st.parent_row[anchor])
        out[k] = _relative(st, k, anchor, cfg)
    return out
