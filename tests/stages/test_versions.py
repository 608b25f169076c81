"""Policy versions in the pipeline: which weights sample an iteration, which trajectories an
update refuses, and that a refreshed predictor never reads an outcome from its future."""

from __future__ import annotations

import polars as pl
import pytest

from trace_core.config import TrainConfig
from trace_core.home.shards import ShardWriter
from trace_core.nodes import NODE_SCHEMA
from trace_core.predictor.synthetic import make_pool, synthetic_iteration
from trace_core.stages import iteration as it
from trace_core.stages.run import RunRef
from trace_core.stages.versions import (
    checkpoint_version,
    outcome_version,
    rollout_version,
    stale_trajectories,
    staleness,
    stamp_version,
)


def test_checkpoint_versions(tmp_path):
    ref = RunRef(str(tmp_path), "r")
    assert checkpoint_version(ref, "/models/warm-start") == 0
    assert checkpoint_version(ref, str(ref.checkpoint(0))) == 1  # update 0 wrote version 1
    assert checkpoint_version(ref, str(ref.checkpoint(41))) == 42
    assert checkpoint_version(ref, str(RunRef(str(tmp_path), "other").checkpoint(3))) == 0  # another run's: a warm start


@pytest.mark.parametrize(("s", "versions"), [(0, [0, 1, 2, 3, 4]), (1, [0, 0, 1, 2, 3]), (2, [0, 0, 0, 1, 2])])
def test_rollout_version_lags_the_update_by_at_most_s(s, versions):
    assert [rollout_version(i, s) for i in range(5)] == versions
    # the update of iteration i trains version i: never more than S versions ahead of its trees
    assert all(0 <= i - v <= s for i, v in enumerate(versions))


def _trees(iteration: int, version: int, run_id: str = "r") -> pl.DataFrame:
    nodes = synthetic_iteration(make_pool(40, seed=1), iteration, seed=2, prompts_per_iter=6, run_id=run_id)
    nodes = nodes.select([c for c in NODE_SCHEMA if c in nodes.columns])
    return stamp_version(nodes.with_columns(pl.lit(iteration, dtype=pl.Int32).alias("iteration")), version)


def test_update_refuses_trajectories_older_than_the_bound():
    nodes = pl.concat([_trees(3, 3), _trees(3, 1).with_columns(pl.col("trajectory_id") + "-old",
                                                                 pl.col("node_id") + "-old")])
    old = set(nodes.filter(pl.col("policy_version") == 1)["trajectory_id"].drop_nulls().to_list())
    fresh = set(nodes.filter(pl.col("policy_version") == 3)["trajectory_id"].drop_nulls().to_list())
    assert stale_trajectories(nodes, version=3, max_staleness=1) == old  # 2 versions old: refused
    assert stale_trajectories(nodes, version=3, max_staleness=2) == set()
    assert not stale_trajectories(nodes, version=3, max_staleness=1) & fresh
    assert staleness(nodes.filter(pl.col("policy_version") == 3), 4) == (1.0, 1)


def test_refreshed_predictor_never_reads_outcomes_from_its_future(tmp_path):
    """Shards of iterations 0-3 on disk (a pipeline that ran ahead before a crash, or resumed):
    the fit for iteration 2 with S = 1 plans for version 1 and reads iterations 0 and 1 only, and
    only what versions <= 1 generated (a planted version-5 node of iteration 1 is left out); it
    records the freshest version it read."""
    ref = RunRef(str(tmp_path), "r")
    writer = ShardWriter(ref.home, ref.run_id, strategy="trace")
    for i, v in enumerate([0, 0, 1, 2]):
        writer.write("nodes", _trees(i, v), stage="final", iteration=i)
    history = it.history_nodes(ref, 2, max_version=rollout_version(2, 1))
    assert sorted(history["iteration"].unique().to_list()) == [0, 1]
    assert outcome_version(history) == 0
    planted = pl.concat([_trees(1, 0), _trees(1, 5).with_columns(pl.col("node_id") + "-future")])
    writer.write("nodes", planted, stage="final", iteration=1)
    seen = it.history_nodes(ref, 2, max_version=1)
    assert seen["policy_version"].max() == 0 and seen.height == history.height
    cfg = TrainConfig.model_validate({"run": {"max_staleness": 1}})
    fit = it.refresh_predictor(ref, cfg, 3, None)  # iteration 3 plans for version 2: sees versions 0, 1
    assert fit.outcome_version == 1
    assert fit.fit.iterations == [0, 1, 2]  # the three earlier iterations, nothing of 3
