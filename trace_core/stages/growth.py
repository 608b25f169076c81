"""Adaptive groups in the stages (``allocation.trace.grow_first``; the rule: ``allocation.growth``).

Stage 2 plans only the first episodes of each chosen prompt (``growth.first_wave``); stage 4 reads
how they ended and buys more episodes of the same prompts with the rest of the budget
(``growth_rows``: one row per sampled root in the prefix-allocation shard, ``kind = 'root'``);
stage 5 generates them as continuations of the root, fresh episodes that join the prompt's raw
group; stage 6 adds them to the roots' ``alloc_children`` and the prompts' ``m_alloc``
(``with_growth``), so every view sees one group of ``m_alloc`` episodes per prompt.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.allocation.config import AllocationConfig
from trace_core.allocation.growth import DEFAULT_CONCENTRATION, growth_table, plan_growth
from trace_core.allocation.planner import PrefixPlan

#: the prefix-allocation shard's rows: prefix decisions and (with growth) root decisions
PREFIX, ROOT = "prefix", "root"
ALLOC_SCHEMA = {"node_id": pl.Utf8, "v_pred": pl.Float64, "flip": pl.Float64, "r": pl.Float64, "k": pl.Int64,
                "utility": pl.Float64, "kind": pl.Utf8}


def growing(cfg: AllocationConfig) -> bool:
    """Whether this run's strategy grows its root groups."""
    return cfg.strategy == "trace" and cfg.knobs("trace").grow_first is not None


def raw_groups(nodes: pl.DataFrame) -> pl.DataFrame:
    """Per sampled prompt: its root ``node_id``, raw ``n_success`` and ``n_total``."""
    leaves = nodes.filter(pl.col("is_leaf") & (pl.col("origin") == "raw")).group_by("prompt_id").agg(
        (pl.col("reward") > 0.5).sum().cast(pl.Int64).alias("n_success"), pl.len().cast(pl.Int64).alias("n_total"))
    roots = nodes.filter(pl.col("depth") == 0).select("node_id", "prompt_id")
    return roots.join(leaves, on="prompt_id", how="inner")


def growth_rows(cfg: AllocationConfig, prompts: pl.DataFrame, v_root: np.ndarray, conc: np.ndarray | None,
                nodes: pl.DataFrame, budget: int) -> pl.DataFrame:
    """Stage 4's root decisions: ``node_id``, posterior mean ``v_pred``, ``k`` more episodes and the
    expected trajectories in contrastive groups they add (``utility``), for every sampled prompt."""
    knobs = cfg.knobs("trace")
    pos = {p: i for i, p in enumerate(prompts["prompt_id"].to_list())}
    g = raw_groups(nodes)
    ix = np.array([pos[p] for p in g["prompt_id"]], dtype=np.int64)
    v = np.asarray(v_root, dtype=np.float64)[ix]
    c = None if conc is None else np.asarray(conc, dtype=np.float64)[ix]
    s, n = g["n_success"].to_numpy(), g["n_total"].to_numpy()
    k = plan_growth(v, c, s, n, budget=budget, max_group=knobs.max_per_prompt)
    gain = growth_table(v, c, s, n, knobs.max_per_prompt)[k, np.arange(len(k))] if len(k) else np.zeros(0)
    cc = np.full(len(v), DEFAULT_CONCENTRATION) if c is None else np.maximum(c, 1e-6)
    return pl.DataFrame({"node_id": g["node_id"], "v_pred": (cc * v + s) / (cc + n), "flip": None, "r": None,
                         "k": k, "utility": gain, "kind": ROOT}, schema=ALLOC_SCHEMA)


def grow_plan(cfg: AllocationConfig, prompts: pl.DataFrame, v_root: np.ndarray, conc: np.ndarray | None,
              nodes: pl.DataFrame, raw_trajectories: int, n_prefixes: int) -> tuple[PrefixPlan, pl.DataFrame]:
    """Stage 4 with adaptive groups: no continuations, no second wave; the budget the raw
    rollouts left grows the sampled prompts' groups (``growth_rows``)."""
    left = max(cfg.budget_total - int(raw_trajectories), 0)
    plan = PrefixPlan(k=np.zeros(n_prefixes, dtype=np.int64), second_wave=np.zeros(prompts.height, dtype=np.int64),
                      budget=left, priced=0)
    return plan, growth_rows(cfg, prompts, v_root, conc, nodes, left)


def prefix_decisions(alloc: pl.DataFrame) -> pl.DataFrame:
    """The prefix rows of a prefix-allocation shard (what ``nodes.with_prefix_decisions`` copies)."""
    return alloc.filter(pl.col("kind") == PREFIX) if "kind" in alloc.columns else alloc


def with_growth(nodes: pl.DataFrame, prompts: pl.DataFrame, alloc: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The roots' ``alloc_children`` and the prompts' ``m_alloc`` with the episodes stage 4 grew."""
    if "kind" not in alloc.columns:
        return nodes, prompts
    grown = alloc.filter((pl.col("kind") == ROOT) & (pl.col("k") > 0)).select("node_id", pl.col("k").alias("_k"))
    if grown.height == 0:
        return nodes, prompts
    nodes = nodes.join(grown, on="node_id", how="left").with_columns(
        (pl.col("alloc_children") + pl.col("_k").fill_null(0)).cast(nodes.schema["alloc_children"])
        .alias("alloc_children")).drop("_k")
    by_prompt = nodes.filter(pl.col("depth") == 0).join(grown, on="node_id").select("prompt_id", "_k")
    prompts = prompts.join(by_prompt, on="prompt_id", how="left").with_columns(
        (pl.col("m_alloc") + pl.col("_k").fill_null(0)).cast(prompts.schema["m_alloc"]).alias("m_alloc")).drop("_k")
    return nodes, prompts
