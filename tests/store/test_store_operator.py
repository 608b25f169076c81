"""The store as the analyst meets it: the DuckDB CLI opens the catalogue, `sql` takes
its format from `--out` and refuses unknown run ids, a comparison id selects its children, the
groups show the raw trajectory they branch from and which continuations flipped, and the
accuracy before training is in `iteration_summary`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from store_fixture import build_fixture_store
from typer.testing import CliRunner

from flows.cli import app
from trace_core import store
from trace_core.config import TrainConfig
from trace_core.home import queries
from trace_core.home.run_row import write_run_row
from trace_core.home.shards import ShardWriter

runner = CliRunner()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = build_fixture_store(tmp_path_factory.mktemp("store"))
    cfg = TrainConfig()
    write_run_row(home, "r1", cfg, "finished", strategy="trace", parent_run_id="cmp")
    write_run_row(home, "r2", cfg, "finished", strategy="uniform", parent_run_id="cmp")
    # a run outside the comparison: its groups must not be pooled into the comparison's
    ShardWriter(home, "r3").write("nodes", pl.read_parquet(
        home / "shards" / "nodes" / "run_id=r2" / "iteration=00000" / "raw_rollouts.parquet",
        hive_partitioning=False).with_columns(pl.lit("r3").alias("run_id"), pl.lit("trace").alias("strategy")),
        iteration=0, stage="raw_rollouts")
    for i, acc in ((0, 0.3), (2, 0.5)):
        ShardWriter(home, "r1", strategy="trace").write("evaluations", pl.DataFrame({
            "run_id": ["r1"], "strategy": ["trace"], "iteration": [i], "split": ["heldout"], "family": ["all"],
            "accuracy": [acc], "episodes": [10]}), iteration=i, stage="final")
    return home


def _duckdb_cli() -> str:
    exe = Path(sys.executable).with_name("duckdb")
    found = str(exe) if exe.is_file() else shutil.which("duckdb")
    if found is None:
        pytest.skip("the DuckDB CLI is not installed (pip install duckdb-cli, in the test extra)")
    return found


def test_duckdb_cli_from_pypi_opens_the_catalogue(home):
    """Defect 7: README's `duckdb -readonly DIR/trace.duckdb -c ...` with the CLI users install."""
    assert store.ensure_catalog(home)
    out = subprocess.run([_duckdb_cli(), "-readonly", "-csv", str(home / "trace.duckdb"), "-c",
                          "select count(*) as n from nodes where run_id = 'r1'"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["n", "21"]  # as trace_core.store.query counts them


def test_a_catalogue_in_a_newer_format_is_rewritten(tmp_path):
    """A home whose catalogue an older trace-rl wrote in DuckDB's newest format is rewritten
    (DuckDB never downgrades a file in place)."""
    import duckdb

    home = build_fixture_store(tmp_path)
    duckdb.connect(str(home / "trace.duckdb")).close()  # storage version 69, no views
    assert store.ensure_catalog(home)
    out = subprocess.run([_duckdb_cli(), "-readonly", "-csv", str(home / "trace.duckdb"), "-c",
                          "select count(*) from runs"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_sql_format_follows_out_and_parquet_needs_out(home, tmp_path, monkeypatch):
    """Defect 6: `--out x.parquet` writes Parquet, `--format parquet` without `--out` writes
    nothing into the working directory."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["sql", "wasted_by_iteration", "--run-id", "r1", "--home", str(home),
                              "--out", "x.parquet"])
    assert res.exit_code == 0, res.output
    assert pl.read_parquet(tmp_path / "x.parquet").height == 2
    res = runner.invoke(app, ["sql", "wasted_by_iteration", "--home", str(home), "--out", "x.csv"])
    assert res.exit_code == 0 and (tmp_path / "x.csv").read_text().startswith("run_id,strategy,iteration")
    res = runner.invoke(app, ["sql", "wasted_by_iteration", "--home", str(home), "--format", "parquet"])
    assert res.exit_code == 2 and "--out" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv", "x.parquet"]
    res = runner.invoke(app, ["sql", "wasted_by_iteration", "--home", str(home), "--format", "csv",
                              "--out", "y.parquet"])
    assert res.exit_code == 2 and not (tmp_path / "y.parquet").exists()


def test_sql_refuses_an_unknown_run_id(home):
    """Defect 6: an unknown --run-id is one line naming the known runs, exit 2 (not an empty table)."""
    res = runner.invoke(app, ["sql", "wasted_by_iteration", "--run-id", "nope", "--home", str(home)])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "unknown run id 'nope'" in err and "r1" in err and "cmp" in err
    ok = runner.invoke(app, ["sql", "allocation_histogram", "--run-id", "r2", "--home", str(home)])
    assert ok.exit_code == 0, ok.output  # a known run with no rows in that table: an empty answer


def test_a_comparison_id_selects_its_children(home):
    """Defect 5: runs.parent_run_id is filled, and `--run-id <comparison>` pools only its children."""
    runs = store.query(home, "select run_id, parent_run_id from runs order by run_id")
    assert runs.rows() == [("r1", "cmp"), ("r2", "cmp")]
    everything = queries.run_named_query(home, "effective_ratio_by_strategy")
    assert everything.filter(pl.col("strategy") == "trace")["runs"][0] == 2  # r1 and r3
    cmp = queries.run_named_query(home, "effective_ratio_by_strategy", run_id="cmp")
    assert sorted(cmp.select("strategy", "runs", "trajectories").rows()) == [("trace", 1, 12), ("uniform", 1, 2)]
    assert queries.run_named_query(home, "wasted_by_iteration", run_id="cmp")["run_id"].unique().sort().to_list() \
        == ["r1", "r2"]


def test_report_of_a_comparison_id_is_the_comparison(home, tmp_path):
    """Defect 5: `trace-rl report <comparison id>` shows its children, not an empty page."""
    out = tmp_path / "cmp.html"
    res = runner.invoke(app, ["report", "cmp", "--home", str(home), "--out", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "trace-rl comparison: cmp" in page and "2 runs" in page
    assert "<td class=\"s\">uniform</td>" in page and "<td class=\"s\">r2</td>" in page
    assert "No trajectories recorded yet" not in page
    bad = runner.invoke(app, ["report", "nope", "--home", str(home), "--out", str(tmp_path / "x.html")])
    assert bad.exit_code == 2


def test_branch_groups_name_their_raw_trajectory_and_flips(home):
    """Defect 8: an extension group's row carries the raw trajectory it branches from (id, reward,
    the group's full size) and how many continuations flipped; trajectories say which flipped."""
    g = queries.catalogue.query(home, "select * from trajectory_groups where run_id = 'r1' and origin = 'extension' "
                                      "order by iteration")
    assert g.select("iteration", "owner_trajectory_id", "owner_reward", "trajectories", "group_size",
                    "group_successes", "flips").rows() == [(0, "a1", 1.0, 1, 2, 2.0, 0), (1, "d1", 0.0, 2, 3, 1.0, 1)]
    raw = queries.catalogue.query(home, "select * from trajectory_groups where run_id = 'r1' and origin = 'raw'")
    assert raw["flips"].null_count() == raw.height and raw["owner_trajectory_id"].null_count() == raw.height
    t = queries.catalogue.query(home, "select trajectory_id, branched_from, flipped from trajectories "
                                      "where run_id = 'r1' and origin = 'extension' order by trajectory_id")
    assert t.rows() == [("e1", "a1", False), ("f1", "d1", True), ("f2", "d1", False)]
    assert queries.catalogue.query(home, "select count(*) as n from trajectories where origin = 'raw' "
                                         "and flipped is not null")["n"][0] == 0


def test_iteration_summary_has_the_accuracy_before_training(home):
    """Defect 8: the evaluation before training (evaluations, iteration 0) is in iteration_summary."""
    f = queries.run_named_query(home, "iteration_summary", run_id="r1")
    assert f.select("iteration", "accuracy_before", "accuracy").rows() == [(0, 0.3, 0.4), (1, None, 0.5)]


def test_a_copied_catalogue_answers_for_its_own_home(home, tmp_path):
    """A copy of a home (`cp -a`): DuckDB opening the copy's trace.duckdb refuses in one line
    instead of reading the original's shards; once any command rebuilds it, it reads the copy's."""
    assert store.ensure_catalog(home)
    copy = tmp_path / "copy"
    shutil.copytree(home, copy, symlinks=True)
    ShardWriter(copy, "r9").write("nodes", pl.read_parquet(
        copy / "shards" / "nodes" / "run_id=r2" / "iteration=00000" / "raw_rollouts.parquet",
        hive_partitioning=False).with_columns(pl.lit("r9").alias("run_id")), iteration=0, stage="raw_rollouts")
    sql = "select count(distinct run_id) as runs from nodes"
    cli = [_duckdb_cli(), "-readonly", "-csv"]
    out = subprocess.run([*cli, str(copy / "trace.duckdb"), "-c", sql], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and f"built for {home.resolve()}" in out.stderr and "--home" in out.stderr
    original = subprocess.run([*cli, str(home / "trace.duckdb"), "-c", sql], capture_output=True, text=True,
                              timeout=120)
    assert original.returncode == 0, original.stderr
    assert store.ensure_catalog(copy)
    rebuilt = subprocess.run([*cli, str(copy / "trace.duckdb"), "-c", sql], capture_output=True, text=True,
                             timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert int(rebuilt.stdout.split()[1]) == int(original.stdout.split()[1]) + 1  # the copy's own run r9
