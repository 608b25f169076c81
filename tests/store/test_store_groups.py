"""Group summaries: the named queries answer the same from the stored summaries as from the raw
node views; an old home (node shards without summaries) gets them when it is opened."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import polars as pl
import pytest
from store_fixture import build_fixture_store, fixture_nodes

from trace_core.home import queries
from trace_core.home.groups import group_rows, stale_partitions, summary_path
from trace_core.home.layout import SORT_KEYS, table_dir
from trace_core.home.migrate import NEW_ITER, NEW_RUN, OLD_ITER, OLD_RUN
from trace_core.home.shards import ShardWriter
from trace_core.nodes import nodes_frame, with_anchors
from trace_core.store import needed_schema, query, schema_sql

GROUPS = "SELECT * FROM trajectory_groups ORDER BY ALL"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return build_fixture_store(tmp_path_factory.mktemp("store"))


def _random_nodes(rng: np.random.Generator, run: str, it: int, prompts: int) -> pl.DataFrame:
    """Random trees: 1-4 raw rollouts of 1-3 turns a prompt, 0-3 continuations from random
    prefixes, rewards 0/1 with a few unverified (null) leaves."""
    rows = []
    for p in range(prompts):
        root = f"{run}/{it}/p{p}"
        base = dict(run_id=run, strategy="trace", iteration=it, prompt_id=f"p{p}", task=["math", "qa", "fc"][p % 3],
                    difficulty=int(p % 4))
        rows.append({**base, "node_id": root, "depth": 0, "origin": "root", "is_leaf": False, "new_tokens": 0})
        prefixes = []
        for j in range(int(rng.integers(1, 5))):
            prev, turns = root, int(rng.integers(1, 4))
            for d in range(1, turns + 1):
                nid = f"{root}/r{j}/{d}"
                leaf = d == turns
                reward = (None if rng.random() < 0.05 else float(rng.random() < 0.5)) if leaf else None
                rows.append({**base, "node_id": nid, "parent_id": prev, "trajectory_id": f"{root}/r{j}", "depth": d,
                             "origin": "raw", "is_leaf": leaf, "reward": reward, "new_tokens": int(rng.integers(1, 9))})
                prev = nid
                if not leaf:
                    prefixes.append((nid, d))
        for e in range(int(rng.integers(0, 4)) if prefixes else 0):
            prev, d0 = prefixes[int(rng.integers(len(prefixes)))]
            for d in range(d0 + 1, d0 + 3):
                nid = f"{root}/e{e}/{d}"
                leaf = d == d0 + 2
                rows.append({**base, "node_id": nid, "parent_id": prev, "trajectory_id": f"{root}/e{e}", "depth": d,
                             "origin": "extension", "is_leaf": leaf,
                             "reward": float(rng.random() < 0.5) if leaf else None, "new_tokens": 3})
                prev = nid
    return with_anchors(nodes_frame(rows))


@pytest.fixture(scope="module")
def random_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("random")
    rng = np.random.default_rng(7)
    for run in ("x1", "x2"):
        writer = ShardWriter(home, run)
        for it in range(3):
            frame = _random_nodes(rng, run, it, 40)
            half = frame.height // 2  # two shards per partition: the summary spans both
            writer.write("nodes", frame.head(half), iteration=it, stage="raw_rollouts")
            writer.write("nodes", frame.tail(frame.height - half), iteration=it, stage="extensions")
    return home


@pytest.mark.parametrize("store", ["home", "random_home"])
@pytest.mark.parametrize("name", queries.list_queries())
def test_named_query_same_from_summaries_and_nodes(request, store, name):
    path = request.getfixturevalue(store)
    for run_id in (None, "r1", "x2"):
        ours = queries.run_named_query(path, name, run_id=run_id)
        raw = queries.run_named_query(path, name, run_id=run_id, from_nodes=True)
        assert ours.equals(raw), (name, run_id, ours, raw)


# top_wasted_prompts as it read the group summaries before the prompt summaries: the reference
TOP_WASTED_FROM_GROUPS = """
SELECT run_id, prompt_id, any_value(task) AS task, any_value(difficulty) AS difficulty,
    count(*) FILTER (WHERE origin = 'raw') AS iterations, sum(trajectories)::BIGINT AS trajectories,
    sum(trajectories - effective)::BIGINT AS wasted, round(sum(successes) / sum(trajectories), 4) AS mean_reward
FROM scoped_groups($run_id::VARCHAR)
GROUP BY run_id, prompt_id
HAVING sum(trajectories - effective) > 0
ORDER BY wasted DESC, run_id, prompt_id
LIMIT 20
"""


@pytest.mark.parametrize("store", ["home", "random_home"])
@pytest.mark.parametrize("name", ["effective_ratio_by_strategy", "wasted_by_difficulty", "wasted_by_iteration",
                                  "wasted_by_task", "top_wasted_prompts"])
def test_queries_over_prompt_summaries_same_as_over_groups(request, store, name):
    """The named queries that read the prompt summaries answer as they did over the groups."""
    path = request.getfixturevalue(store)
    sql = queries.load_query(name)
    assert "scoped_prompt_groups" in sql
    over_groups = TOP_WASTED_FROM_GROUPS if name == "top_wasted_prompts" else \
        sql.replace("scoped_prompt_groups", "scoped_groups")
    for run_id in (None, "r1", "x2"):
        ours = query(path, sql, {"run_id": run_id})
        assert ours.equals(query(path, over_groups, {"run_id": run_id})), (name, run_id)


@pytest.mark.parametrize("store", ["home", "random_home"])
def test_summary_rows_equal_the_node_view(request, store):
    path = request.getfixturevalue(store)
    ours = query(path, GROUPS)
    assert ours.height > 0
    assert ours.equals(query(path, GROUPS, from_nodes=True))


def test_group_rows_sorted_for_pruning(home):
    shard = pl.read_parquet(summary_path(home, "r1", 1))
    keys = ["run_id", "iteration", *SORT_KEYS["trajectory_groups"]]
    assert shard.equals(shard.sort(keys, nulls_last=True))
    assert shard.equals(group_rows(pl.concat([f for (r, i, _), f in fixture_nodes().items() if (r, i) == ("r1", 1)])))


def test_old_home_gets_its_summaries_when_opened(home, tmp_path):
    """A home written before the summaries (no trajectory_groups shards) answers the same: the
    summaries are written on the first open."""
    old = tmp_path / "old"
    shutil.copytree(home, old)
    shutil.rmtree(table_dir(old, "trajectory_groups"))
    assert len(stale_partitions(old)) == 3
    for name in queries.list_queries():
        assert queries.run_named_query(old, name).equals(queries.run_named_query(home, name)), name
    assert stale_partitions(old) == [] and summary_path(old, "r1", 0).is_file()


def test_home_without_prompt_summaries_gets_them_when_opened(home, tmp_path):
    """A home whose group summaries predate the prompt summaries: each partition is summarised
    again on the first open, and top_wasted_prompts answers the same."""
    old = tmp_path / "no_prompts"
    shutil.copytree(home, old)
    shutil.rmtree(table_dir(old, "prompt_groups"))
    assert len(stale_partitions(old)) == 3
    assert queries.run_named_query(old, "top_wasted_prompts").equals(queries.run_named_query(home, "top_wasted_prompts"))
    assert stale_partitions(old) == [] and summary_path(old, "r1", 0, "prompt_groups").is_file()


def test_old_layout_home_migrated_then_summarised(home, tmp_path):
    """run=R/iter=N directories of the layout before hive keys: moved, then summarised."""
    old = tmp_path / "older"
    shutil.copytree(home, old)
    shutil.rmtree(table_dir(old, "trajectory_groups"))
    for table in ("nodes", "prompts", "iterations", "predictions"):
        tdir = table_dir(old, table)
        for run in [p for p in tdir.iterdir() if p.name.startswith(NEW_RUN)]:
            for it in [p for p in run.iterdir() if p.name.startswith(NEW_ITER)]:
                it.rename(run / (OLD_ITER + it.name.removeprefix(NEW_ITER)))
            run.rename(tdir / (OLD_RUN + run.name.removeprefix(NEW_RUN)))
    assert queries.run_named_query(old, "wasted_by_iteration").equals(queries.run_named_query(home, "wasted_by_iteration"))


def test_summary_follows_its_node_shards(home, tmp_path):
    """Rewriting or removing a node shard rewrites the partition's summary; so does a shard
    changed behind the writer's back (found stale at the next open)."""
    h = tmp_path / "h"
    shutil.copytree(home, h)
    writer = ShardWriter(h, "r1")
    before = queries.run_named_query(h, "wasted_by_depth", run_id="r1")
    assert writer.remove("nodes", stage="extensions", iteration=1)
    after = queries.run_named_query(h, "wasted_by_depth", run_id="r1")
    assert after.equals(queries.run_named_query(h, "wasted_by_depth", run_id="r1", from_nodes=True))
    assert not after.equals(before)
    writer.write("nodes", fixture_nodes()[("r1", 1, "extensions")], iteration=1, stage="extensions")
    assert queries.run_named_query(h, "wasted_by_depth", run_id="r1").equals(before)
    # a node shard replaced outside the writer: older summary, rebuilt on the next open
    part = summary_path(h, "r1", 0)
    os.utime(part, ns=(1, 1))
    assert stale_partitions(h) == [table_dir(h, "nodes") / "run_id=r1" / "iteration=00000"]
    assert queries.run_named_query(h, "wasted_by_depth", run_id="r1").equals(before)
    assert stale_partitions(h) == []


def test_shards_older_than_the_declared_columns_are_upgraded_once(home, tmp_path):
    """The views read every shard by one shard's columns: a home whose shards predate a column
    (its schema shard stale) has them rewritten with the column null when it is opened."""
    old = tmp_path / "cols"
    shutil.copytree(home, old)
    for f in table_dir(old, "nodes").rglob("*.parquet"):
        pl.read_parquet(f).drop("gen_seconds", "answered").write_parquet(f)
    expected = query(home, "SELECT * FROM nodes ORDER BY node_id")
    assert query(old, "SELECT * FROM nodes ORDER BY node_id").equals(expected)
    assert all("gen_seconds" in pl.read_parquet_schema(f) for f in table_dir(old, "nodes").rglob("*.parquet"))


def test_a_named_query_over_groups_creates_no_node_view(home):
    """Binding a table's view lists every partition of the table: a named query's connection
    creates only the views and macros the query uses (and those they use)."""
    made = set(re.findall(r"CREATE OR REPLACE (?:VIEW|MACRO) (\w+)",
                          needed_schema(schema_sql(home), queries.load_query("wasted_by_depth"))))
    assert made == {"trajectory_groups", "runs", "scoped_groups"}
    made = set(re.findall(r"CREATE OR REPLACE (?:VIEW|MACRO) (\w+)",
                          needed_schema(schema_sql(home), "SELECT * FROM trajectory_groups_from_nodes")))
    assert made == {"nodes", "trajectory_groups_from_nodes"}
