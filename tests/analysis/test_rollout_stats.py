"""The rollout statistics named as TRL / verl name them, on the hand-checked store
fixture's iteration 1 of run r1 (tests/store/store_fixture.py): A: a3 = a4 = 1; D: d1 = d2 = 0
(2 turns each), continuations f1 = 1, f2 = 0 from d1's turn 1; 10 tokens a turn."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_fixture import fixture_nodes  # noqa: E402

from trace_core.analysis.rollout_stats import rollout_metrics  # noqa: E402


@pytest.fixture()
def nodes() -> pl.DataFrame:
    f = fixture_nodes()
    frame = pl.concat([f[("r1", 1, "raw_rollouts")], f[("r1", 1, "extensions")]])
    # d1's first turn calls a tool that fails: the path's running error count is 1 from there on
    below = pl.col("node_id").is_in(["r1/1/d1/1", "r1/1/d1/2", "r1/1/f1/2", "r1/1/f2/2"])
    return frame.with_columns(
        pl.when(pl.col("node_id") == "r1/1/d1/1").then(pl.lit('<tool_call>{"name": "x"}</tool_call>'))
        .otherwise(pl.col("action_text")).alias("action_text"),
        pl.when(below).then(1).otherwise(0).cast(pl.Int32).alias("tool_errors"))


def test_rollout_metrics_by_hand(nodes):
    m = rollout_metrics(nodes, max_new_tokens=11, seconds={"raw": 2.0, "extensions": 0.5})
    assert m["reward/mean"] == pytest.approx(0.5) and m["reward/std"] == pytest.approx(0.5)
    assert m["reward/frac_zero_std"] == pytest.approx(2 / 3)  # A {1,1}, D {0,0}; the branch {d1=0, 1, 0} is not
    assert m["response/mean_length"] == pytest.approx(80 / 6) and m["response/max_length"] == 20
    assert m["response/clipped_ratio"] == 0.0
    assert m["episode/turns_mean"] == pytest.approx(10 / 6) and m["episode/turns_max"] == 2
    assert m["episode/tool_calls_mean"] == pytest.approx(1 / 6) and m["episode/tool_error_rate"] == 1.0
    assert m["time/raw_tokens_per_s"] == pytest.approx(60 / 2.0)
    assert m["time/extensions_tokens_per_s"] == pytest.approx(20 / 0.5)
    assert rollout_metrics(nodes, max_new_tokens=10)["response/clipped_ratio"] == 1.0  # every turn hit the cap


def test_no_trajectories_no_metrics(nodes):
    assert rollout_metrics(nodes.filter(pl.col("depth") == 0), max_new_tokens=8) == {}
