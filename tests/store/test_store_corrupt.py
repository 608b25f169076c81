"""A truncated or damaged shard: queries name the file instead of failing with
a traceback, ``skip_bad`` / ``trace-rl sql --skip-bad`` answers from the other shards, and
``read_shard`` names the file it could not read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from store_fixture import build_fixture_store
from typer.testing import CliRunner

from flows.cli import app
from trace_core import store
from trace_core.home import queries
from trace_core.home.shards import CorruptShard, bad_shards, read_shard

COUNT = "SELECT run_id, iteration, count(*) AS n FROM nodes GROUP BY ALL ORDER BY ALL"


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


@pytest.fixture
def homes(tmp_path):
    """A store with one shard damaged, and the same store without that shard."""
    good = build_fixture_store(tmp_path / "good")
    victim = sorted((good / "shards" / "nodes" / "run_id=r1").rglob("*.parquet"))[0]
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    victim.unlink()  # 'good' now holds exactly the readable rest
    return good, bad, bad / victim.relative_to(good)


def test_query_names_the_bad_shard_and_skip_bad_reads_the_rest(homes):
    good, bad, victim = homes
    _truncate(victim)
    with pytest.raises(CorruptShard) as err:
        store.query(bad, COUNT)
    assert err.value.path == victim.resolve() and str(victim.name) in str(err.value)
    assert store.query(bad, COUNT, skip_bad=True).equals(store.query(good, COUNT))


def test_read_shard_names_the_file(homes):
    _, _, victim = homes
    _truncate(victim)
    assert list(bad_shards(victim.parents[4])) == [victim]
    with pytest.raises(CorruptShard, match=f"corrupt shard {victim}"):
        read_shard(victim)
    with pytest.raises(FileNotFoundError, match="missing"):
        read_shard(victim.with_name("gone.parquet"))


def test_sql_cli_one_line_exit_2_then_skip_bad(homes):
    good, bad, victim = homes
    _truncate(victim)
    runner = CliRunner()
    failed = runner.invoke(app, ["sql", "wasted_by_iteration", "--home", str(bad), "--format", "csv"])
    assert failed.exit_code == 2, failed.output
    assert "Traceback" not in failed.output and len(failed.stderr.strip().splitlines()) == 1
    assert str(victim) in failed.stderr and "--skip-bad" in failed.stderr
    skipped = runner.invoke(app, ["sql", "wasted_by_iteration", "--home", str(bad), "--format", "csv", "--skip-bad"])
    expected = runner.invoke(app, ["sql", "wasted_by_iteration", "--home", str(good), "--format", "csv"])
    assert skipped.exit_code == 0, skipped.output
    assert pl.read_csv(skipped.stdout.encode()).equals(pl.read_csv(expected.stdout.encode()))
    assert str(victim) in skipped.stderr


def test_a_truncated_node_shard_keeps_its_partitions_old_summary_out_of_the_answers(homes):
    """Its partition's group summary cannot be rewritten and stays as it was, but no answer reads
    it: the questions over groups name the shard, and with skip_bad answer from the readable nodes."""
    good, bad, victim = homes
    part = victim.parent.relative_to(bad / "shards" / "nodes")
    summary = bad / "shards" / "trajectory_groups" / part / "summary.parquet"
    kept = summary.read_bytes()
    _truncate(victim)
    with pytest.raises(CorruptShard, match="--skip-bad"):
        queries.run_named_query(bad, "wasted_by_depth")
    for name in ("wasted_by_depth", "top_wasted_prompts"):
        assert queries.run_named_query(bad, name, skip_bad=True).equals(queries.run_named_query(good, name)), name
    assert summary.read_bytes() == kept
