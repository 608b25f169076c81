"""Advantage estimators over the node table: pure, registered functions (verl-style).

Every estimator maps a finalized node table (``subtree_mean_reward`` filled) to one advantage
per node. The advantage of a node is the advantage of *the turn that produced it*: every action
token of that turn gets it (``policy.update`` spreads it over the tokens). Roots get null.

* ``grpo``: the leaves of one prompt form the group; ``A(node) = mean reward below node − mean
  reward of the prompt`` (optionally / std of the prompt's rewards). On an unbranched tree every
  turn of rollout ``j`` gets ``r_j − mean(r)``, which is GRPO.
* ``tree``: the anchor of a turn is the nearest ancestor with more than one child (a branch
  point: the root with ``m ≥ 2`` rollouts, or a prefix with its continuations plus the original
  continuation). ``A(node) = mean reward below node − mean reward below anchor`` (optionally /
  std of the rewards below the anchor). Without extensions it equals ``grpo``; a turn with no
  branch point above it (a prompt sampled once) gets 0: nothing to contrast it with.

Usage::

    nodes = compute_advantages(finalize_tree(nodes), AdvantageConfig(estimator="tree"))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from trace_core.registry import Registry
from trace_core.rollout_nodes import finalize_tree
from trace_core.tree import NODE_SCHEMA


class AdvantageConfig(BaseModel):
    """Which estimator turns rewards into per-turn advantages."""

    model_config = ConfigDict(extra="forbid")

    estimator: str = Field("tree", description="Registered estimator name ('tree' default for branched trees, 'grpo').")
    scale_std: bool = Field(False, description="Divide by the group's reward std (population std, + eps); "
                            "off by default (Dr. GRPO: std scaling over-weights near-uniform groups).")
    eps: float = Field(1e-6, gt=0, le=1.0, description="Added to the std before dividing.")


Estimator = Callable[[pl.DataFrame, AdvantageConfig], np.ndarray]
_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register_adv_est(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator registering an estimator ``fn(nodes, cfg) -> float array, one per row (NaN = none)``."""
    return _ESTIMATORS.register(name)


def get_adv_est(name: str) -> Estimator:
    return _ESTIMATORS.get_item(name)


def compute_advantages(nodes: pl.DataFrame, cfg: AdvantageConfig | None = None) -> pl.DataFrame:
    """``nodes`` with the ``advantage`` column filled by ``cfg.estimator`` (subtree rewards refreshed)."""
    cfg = cfg or AdvantageConfig()
    est = get_adv_est(cfg.estimator)
    nodes = finalize_tree(nodes)
    adv = est(nodes, cfg)
    return nodes.with_columns(pl.Series("advantage", adv, dtype=NODE_SCHEMA["advantage"], nan_to_null=True))


class _TreeStats:
    """Per-node mean / std of leaf rewards below, children counts and parents."""

    def __init__(self, nodes: pl.DataFrame) -> None:
        self.ids: list[str] = nodes["node_id"].to_list()
        self.parent: dict[str, str | None] = dict(zip(self.ids, nodes["parent_id"].to_list(), strict=True))
        self.children: dict[str, int] = dict.fromkeys(self.ids, 0)
        for p in self.parent.values():
            if p in self.children:
                self.children[p] += 1
        s1, s2, n = dict.fromkeys(self.ids, 0.0), dict.fromkeys(self.ids, 0.0), dict.fromkeys(self.ids, 0)
        for nid, leaf, r in zip(self.ids, nodes["is_leaf"].to_list(), nodes["reward"].to_list(), strict=True):
            if not leaf or r is None:
                continue
            cur: str | None = nid
            while cur is not None and cur in n:
                s1[cur] += r
                s2[cur] += r * r
                n[cur] += 1
                cur = self.parent.get(cur)
        self.mean = {i: s1[i] / n[i] if n[i] else np.nan for i in self.ids}
        self.std = {i: float(np.sqrt(max(s2[i] / n[i] - self.mean[i] ** 2, 0.0))) if n[i] else np.nan
                    for i in self.ids}

    def advantage(self, nid: str, anchor: str | None, cfg: AdvantageConfig) -> float:
        if anchor is None or np.isnan(self.mean[nid]) or np.isnan(self.mean[anchor]):
            return 0.0
        a = self.mean[nid] - self.mean[anchor]
        return a / (self.std[anchor] + cfg.eps) if cfg.scale_std else a


@register_adv_est("grpo")
def grpo_advantage(nodes: pl.DataFrame, cfg: AdvantageConfig) -> np.ndarray:
    """Group = all leaves of the prompt's root. Returns (N,) with NaN for roots."""
    st = _TreeStats(nodes)
    out = np.full(len(st.ids), np.nan)
    for k, nid in enumerate(st.ids):
        if st.parent[nid] is None:
            continue
        root = nid
        while st.parent.get(root) is not None:
            root = st.parent[root]  # type: ignore[assignment]
        out[k] = st.advantage(nid, root if st.children[root] > 1 else None, cfg)
    return out


@register_adv_est("tree")
def tree_advantage(nodes: pl.DataFrame, cfg: AdvantageConfig) -> np.ndarray:
    """Anchor = nearest ancestor with > 1 child. Returns (N,) with NaN for roots."""
    st = _TreeStats(nodes)
    out = np.full(len(st.ids), np.nan)
    for k, nid in enumerate(st.ids):
        anchor = st.parent[nid]
        if anchor is None:
            continue
        while anchor is not None and st.children.get(anchor, 0) < 2:
            anchor = st.parent.get(anchor)
        out[k] = st.advantage(nid, anchor, cfg)
    return out
