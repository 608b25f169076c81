"""The hive layout (pruning on run_id / iteration), old homes migrated on open, the anchor
columns, and the ``runs`` table."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import polars as pl
import pytest
from store_fixture import build_fixture_store, fixture_nodes

from trace_core import store
from trace_core.config import TrainConfig
from trace_core.home import queries
from trace_core.home.layout import table_dir
from trace_core.home.migrate import LayoutConflict, migrate_layout
from trace_core.home.run_row import git_commit, recording_run, write_run_row
from trace_core.home.shards import ShardWriter

QUERIES = ("wasted_by_iteration", "wasted_by_task", "wasted_by_depth", "top_wasted_prompts", "iteration_summary")


def _to_old_layout(home: Path) -> None:
    """Rewrite a home as the older code left it: run=/iter= directories, nodes without anchors."""
    for run_dir in sorted((home / "shards").glob("*/run_id=*")):
        for sub in sorted(run_dir.glob("iteration=*")):
            for f in sub.glob("*.parquet"):
                if run_dir.parent.name == "nodes":
                    pl.read_parquet(f).drop("anchor_id", "anchor_trajectory_id").write_parquet(f)
            sub.rename(run_dir / sub.name.replace("iteration=", "iter="))
        run_dir.rename(run_dir.with_name(run_dir.name.replace("run_id=", "run=")))


def test_old_home_is_migrated_on_open_with_the_same_answers(tmp_path):
    new = build_fixture_store(tmp_path / "new")
    want = {q: queries.run_named_query(new, q, run_id="r1") for q in QUERIES}
    old = build_fixture_store(tmp_path / "old")
    _to_old_layout(old)
    assert list(table_dir(old, "nodes").glob("run=r1/iter=00000/*.parquet"))
    got = {q: queries.run_named_query(old, q, run_id="r1") for q in QUERIES}  # opening migrates
    for q in QUERIES:
        assert got[q].equals(want[q]), q
    assert not list((old / "shards").glob("*/run=*")) and not list((old / "shards").rglob("*.tmp"))
    assert sorted(p.name for p in table_dir(old, "nodes").glob("run_id=r1/*")) == ["iteration=00000", "iteration=00001"]
    assert "anchor_id" in pl.read_parquet_schema(next(table_dir(old, "nodes").glob("run_id=r1/iteration=00001/*")))
    assert migrate_layout(old) == 0  # nothing left to move


def test_migration_refuses_two_copies_of_a_shard(tmp_path):
    home = build_fixture_store(tmp_path)
    _to_old_layout(home)
    (table_dir(home, "nodes") / "run_id=r1" / "iteration=00000").mkdir(parents=True)  # already there too
    with pytest.raises(LayoutConflict, match=r"already exists .* keep one of them") as err:
        store.query(home, "SELECT count(*) FROM nodes")
    assert "\n" not in str(err.value)


def test_a_filter_on_run_and_iteration_reads_one_file(tmp_path):
    home = build_fixture_store(tmp_path)
    with store.connect(home) as con:
        plan = con.execute("EXPLAIN ANALYZE SELECT count(*) FROM nodes WHERE run_id = 'r1' AND iteration = 1").fetchall()
    text = plan[0][1]
    assert "Scanning Files: 2/5" in text  # r1's iteration 1: raw_rollouts and extensions, of 5 node shards
    assert store.query(home, "SELECT count(*) AS n FROM nodes WHERE run_id = 'r1' AND iteration = 1")["n"][0] == \
        sum(f.height for (r, i, _), f in fixture_nodes().items() if (r, i) == ("r1", 1))


def test_writer_fills_missing_anchors(tmp_path):
    frame = pl.concat([f for (r, i, _), f in fixture_nodes().items() if (r, i) == ("r1", 1)])
    bare = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias("anchor_id"),
                              pl.lit(None, dtype=pl.Utf8).alias("anchor_trajectory_id"))
    path = ShardWriter(tmp_path, "r1").write("nodes", bare, iteration=1, stage="final")
    back = pl.read_parquet(path).sort("node_id")
    assert back.select("anchor_id", "anchor_trajectory_id").equals(
        frame.sort("node_id").select("anchor_id", "anchor_trajectory_id"))
    f1 = back.filter(pl.col("trajectory_id") == "f1").row(0, named=True)
    assert (f1["anchor_id"], f1["anchor_trajectory_id"]) == ("r1/1/d1/1", "d1")


def test_runs_table_follows_a_run(tmp_path):
    cfg = TrainConfig()
    with recording_run(tmp_path, "ok", cfg, strategy="trace", seed=3):
        row = store.query(tmp_path, "SELECT * FROM runs").row(0, named=True)
        assert row["status"] == "running" and row["finished_at"] is None and row["run_id"] == "ok"
    with pytest.raises(RuntimeError, match="boom"), recording_run(tmp_path, "bad", cfg):
        raise RuntimeError("boom")
    runs = store.query(tmp_path, "SELECT * FROM runs ORDER BY run_id")
    assert runs["run_id"].to_list() == ["bad", "ok"] and runs["status"].to_list() == ["failed", "finished"]
    ok = runs.row(1, named=True)
    assert ok["started_at"] == row["started_at"] and ok["finished_at"] >= ok["started_at"]
    assert ok["strategy"] == "trace" and ok["seed"] == 3 and len(ok["config_hash"]) == 12
    head = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert ok["git_commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    write_run_row(tmp_path, "ok", cfg, "running")  # resumed: its first start is kept, one row per run
    again = store.query(tmp_path, "SELECT * FROM runs WHERE run_id = 'ok'")
    assert again.height == 1 and again["started_at"][0] == ok["started_at"]
    assert git_commit(tmp_path) is None  # a directory outside any checkout
    with pytest.raises(ValueError, match="status"):
        write_run_row(tmp_path, "ok", cfg, "paused")


def test_shard_write_syncs_new_directories(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    path = ShardWriter(tmp_path, "r9").write("nodes", fixture_nodes()[("r2", 0, "raw_rollouts")]
                                             .with_columns(pl.lit("r9").alias("run_id")), iteration=0, stage="final")
    assert any(s.startswith(f"{path.parent}/.final.") and s.endswith(".tmp") for s in synced)  # the file, then renamed
    for d in (path.parent, path.parent.parent, path.parent.parent.parent):  # the rename, and the new directories
        assert str(d) in synced
