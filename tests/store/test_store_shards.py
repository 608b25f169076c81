"""Shard writes (atomic, deterministic, replace-not-append) and the DuckDB catalogue under
concurrent readers in other processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import polars as pl
import pytest
from store_fixture import fixture_nodes

from trace_core import store
from trace_core.home import layout, shards
from trace_core.home.layout import shard_path
from trace_core.home.shards import ShardWriter, write_shard
from trace_core.nodes import NODE_SCHEMA

REPO = Path(__file__).resolve().parents[2]


def _nodes(run="r1", it=0):
    return fixture_nodes()[(run, it, "raw_rollouts")]


def n_nodes(home) -> int:
    return store.query(home, "SELECT count(*) AS n FROM nodes")["n"][0]


def test_shard_path_is_deterministic(tmp_path):
    p = shard_path(tmp_path, "nodes", "run-1", "raw_rollouts", 7)
    assert p == tmp_path / "shards/nodes/run_id=run-1/iteration=00007/raw_rollouts.parquet"
    assert shard_path(tmp_path, "runs", "run-1", "config") == tmp_path / "shards/runs/run_id=run-1/config.parquet"
    with pytest.raises(ValueError, match="need an iteration"):
        shard_path(tmp_path, "nodes", "run-1", "x")
    with pytest.raises(ValueError, match="run_id"):
        shard_path(tmp_path, "nodes", "../escape", "x", 0)
    with pytest.raises(KeyError, match="known tables"):
        shard_path(tmp_path, "nope", "r", "x", 0)


def test_rewriting_a_stage_replaces_its_shard(tmp_path):
    w = ShardWriter(tmp_path, "r1")
    frame = _nodes()
    w.write("nodes", frame, iteration=0, stage="raw_rollouts")
    w.write("nodes", frame, iteration=0, stage="raw_rollouts")
    assert n_nodes(tmp_path) == frame.height
    w.write("nodes", frame.head(3), iteration=0, stage="raw_rollouts")
    assert n_nodes(tmp_path) == 3
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".parquet")]
    assert leftovers == []


def test_written_shard_has_the_declared_schema(tmp_path):
    path = ShardWriter(tmp_path, "r1").write("nodes", _nodes().select("node_id", "depth"), iteration=0, stage="s")
    back = pl.read_parquet(path)
    assert dict(back.schema) == NODE_SCHEMA
    assert back["run_id"].unique().to_list() == ["r1"]


def test_conform_rejects_unknown_columns_and_foreign_rows(tmp_path):
    with pytest.raises(ValueError, match="no columns"):
        shards.conform(pl.DataFrame({"node_id": ["a"], "bogus": [1]}), "nodes")
    with pytest.raises(ValueError, match="run_id other than"):
        write_shard(tmp_path, "nodes", _nodes("r2"), run_id="r1", stage="s", iteration=0)
    with pytest.raises(ValueError, match="iteration other than"):
        write_shard(tmp_path, "nodes", _nodes(), run_id="r1", stage="s", iteration=5)


def test_failed_write_leaves_old_shard_and_no_temp_file(tmp_path, monkeypatch):
    w = ShardWriter(tmp_path, "r1")
    path = w.write("nodes", _nodes(), iteration=0, stage="raw_rollouts")
    before = path.read_bytes()

    def boom(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", boom)
    monkeypatch.setattr(layout.pq, "write_table", lambda *a, **k: boom(None))  # node shards' writer
    with pytest.raises(OSError, match="disk full"):
        w.write("nodes", _nodes().head(1), iteration=0, stage="raw_rollouts")
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["raw_rollouts.parquet"]


def test_catalogue_created_once_and_sees_new_shards(tmp_path):
    assert store.ensure_catalog(tmp_path)
    cat = store.catalog_path(tmp_path)
    mtime = cat.stat().st_mtime_ns
    ShardWriter(tmp_path, "r1").write("nodes", _nodes(), iteration=0, stage="raw_rollouts")
    assert store.ensure_catalog(tmp_path)
    assert cat.stat().st_mtime_ns == mtime  # current: not rewritten
    with store.open_catalog(tmp_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM nodes").fetchone()[0] == _nodes().height
        assert {r[0] for r in con.execute("SHOW TABLES").fetchall()} >= {"nodes", "prompts", "iterations", "predictions"}


_READER = textwrap.dedent(
    """
    import sys, duckdb
    home, mode = sys.argv[1], sys.argv[2]
    con = duckdb.connect(home + "/trace.duckdb", read_only=(mode == "ro"), config={"file_search_path": home})
    print("ready", con.execute("SELECT count(*) FROM nodes").fetchone()[0], flush=True)
    sys.stdin.readline()  # hold the catalogue open until the test says so
    print("seen", con.execute("SELECT count(*) FROM nodes").fetchone()[0], flush=True)
    """
)


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_training_writes_while_another_process_holds_the_catalogue(tmp_path, monkeypatch, mode):
    """A reader (read-only, or an analyst's read-write CLI session) holds trace.duckdb open in
    another process; writing shards, refreshing the catalogue and querying must not fail."""
    store.ensure_catalog(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(tmp_path), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        assert proc.stdout.readline().split() == ["ready", "0"]
        w = ShardWriter(tmp_path, "r1")
        w.write("nodes", _nodes(), iteration=0, stage="raw_rollouts")
        w.write("nodes", _nodes("r1", 1), iteration=1, stage="raw_rollouts")
        if mode == "ro":
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert store.ensure_catalog(tmp_path)  # current: a shared read of the stamp suffices
        else:
            with pytest.warns(RuntimeWarning, match="busy"):  # cannot even read the stamp: warn only
                assert not store.ensure_catalog(tmp_path)
        monkeypatch.setattr(store, "schema_sha", lambda home=None: "stale")  # force a refresh attempt
        with pytest.warns(RuntimeWarning, match="busy"):
            assert not store.ensure_catalog(tmp_path)
        total = _nodes().height + _nodes("r1", 1).height
        assert n_nodes(tmp_path) == total  # in-memory queries never touch the file lock
        out, _ = proc.communicate("go\n", timeout=60)
        assert out.split() == ["seen", str(total)]  # the reader sees the new shards, no refresh
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
