"""What a run's earlier iterations spent, read back from their node shards: the budget planner's
inputs (the one-price reserve, the equal-token budget)."""

from __future__ import annotations

import polars as pl

from trace_core.home.layout import shard_path
from trace_core.home.shards import read_shard
from trace_core.stages.run import RunRef


def previous_continuations(ref: RunRef, iteration: int) -> int | None:
    """Continuations the previous iteration bought (None at iteration 0 or when its shard is
    gone): the planner sizes the first root wave's reserve from it."""
    if iteration == 0:
        return None
    path = shard_path(ref.home, "nodes", ref.run_id, "final", iteration - 1)
    if not path.is_file():
        return None
    return read_shard(path).filter(pl.col("is_leaf") & (pl.col("origin") == "extension")).height


def spent_tokens(ref: RunRef, iteration: int) -> tuple[int, float | None]:
    """Tokens the iterations before ``iteration`` generated (everything: roots, continuations,
    refills), and the last one's tokens per trajectory (None at iteration 0 or when a shard is gone)."""
    total, price = 0, None
    for i in range(iteration):
        path = shard_path(ref.home, "nodes", ref.run_id, "final", i)
        if not path.is_file():
            return total, None
        nodes = read_shard(path)
        tokens, trajectories = int(nodes["new_tokens"].sum() or 0), int(nodes["is_leaf"].sum() or 0)
        total += tokens
        price = tokens / trajectories if trajectories else None
    return total, price
