"""Every named query on the hand-checked fixture (see store_fixture.py for the expected trees)."""

from __future__ import annotations

import polars as pl
import pytest
from store_fixture import build_fixture_store

from trace_core.home import queries
from trace_core.store import query


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return build_fixture_store(tmp_path_factory.mktemp("store"))


def rows(frame: pl.DataFrame, *cols: str) -> list[tuple]:
    return list(frame.select(cols).iter_rows())


def test_every_query_file_is_tested():
    tested = {n.removeprefix("test_") for n in globals() if n.startswith("test_")}
    missing = [q for q in queries.list_queries() if q not in tested]
    assert not missing, f"named queries without a fixture test: {missing}"


def test_trajectories_view_marks_groups(home):
    t = query(home, "SELECT * FROM trajectories WHERE run_id = $run_id ORDER BY trajectory_id", {"run_id": "r1"})
    wasted = dict(zip(t["trajectory_id"], t["wasted"], strict=True))
    assert wasted == {
        "a1": False, "a2": False, "e1": True, "b1": True, "b2": True, "c1": True,
        "a3": True, "a4": True, "d1": False, "d2": True, "f1": False, "f2": False,
    }
    by = {r["trajectory_id"]: r for r in t.iter_rows(named=True)}
    assert by["e1"]["anchor_id"] == "r1/0/a1/1" and by["e1"]["anchor_depth"] == 1 and by["e1"]["group_size"] == 2
    assert by["f1"]["group_size"] == 3 and by["a1"]["group_size"] == 2 and by["c1"]["group_size"] == 1
    assert by["a1"]["tokens"] == 20 and by["a1"]["turns"] == 2 and by["a1"]["origin"] == "raw"


def test_scope_macros_keep_one_run_or_all(home):
    """scoped_groups / scored_predictions (sql/schema.sql): the scoping the named queries share."""
    groups = query(home, "SELECT run_id, count(*) AS n FROM trajectory_groups GROUP BY ALL ORDER BY ALL")
    assert query(home, "SELECT run_id, count(*) AS n FROM scoped_groups(NULL) GROUP BY ALL ORDER BY ALL").rows() \
        == groups.rows()
    r1 = query(home, "SELECT DISTINCT run_id FROM scoped_groups($run_id::VARCHAR)", {"run_id": "r1"})
    assert r1["run_id"].to_list() == ["r1"]
    scored = query(home, "SELECT * FROM scored_predictions(NULL)")
    assert scored.height == query(home, "SELECT count(*) AS n FROM predictions "
                                        "WHERE v_pred IS NOT NULL AND outcome IS NOT NULL")["n"][0]
    assert scored["weight"].null_count() == 0 and scored.columns == query(home, "FROM predictions").columns


def test_wasted_by_iteration(home):
    f = queries.run_named_query(home, "wasted_by_iteration", run_id="r1")
    assert rows(f, "iteration", "trajectories", "wasted", "tokens", "wasted_tokens") == [
        (0, 6, 4, 80, 40),
        (1, 6, 3, 80, 40),  # d1 (20 tokens) owns a contrastive branch group
    ]
    assert f["wasted_share"].to_list() == [0.6667, 0.5]
    assert f["effective_ratio"].to_list() == [0.3333, 0.5]
    everything = queries.run_named_query(home, "wasted_by_iteration")
    assert rows(everything, "run_id", "iteration", "wasted") == [("r1", 0, 4), ("r1", 1, 3), ("r2", 0, 0)]


def test_wasted_by_task(home):
    f = queries.run_named_query(home, "wasted_by_task", run_id="r1")
    assert rows(f, "task", "trajectories", "wasted", "mean_reward") == [
        ("math", 5, 3, 0.8),
        ("qa", 3, 3, 0.3333),
        ("fc", 4, 1, 0.25),
    ]


def test_wasted_by_depth(home):
    f = queries.run_named_query(home, "wasted_by_depth", run_id="r1")
    assert rows(f, "anchor_depth", "trajectories", "wasted", "wasted_tokens") == [(0, 9, 6, 70), (1, 3, 1, 10)]


def test_wasted_by_difficulty(home):
    f = queries.run_named_query(home, "wasted_by_difficulty", run_id="r1")
    assert rows(f, "task", "difficulty", "trajectories", "wasted") == [
        ("fc", 3, 4, 1),
        ("math", 1, 5, 3),
        ("qa", 2, 3, 3),
    ]


def test_top_wasted_prompts(home):
    f = queries.run_named_query(home, "top_wasted_prompts", run_id="r1")
    assert rows(f, "prompt_id", "iterations", "trajectories", "wasted") == [
        ("A", 2, 5, 3),
        ("B", 1, 2, 2),
        ("C", 1, 1, 1),
        ("D", 1, 4, 1),
    ]
    assert queries.run_named_query(home, "top_wasted_prompts", run_id="r2").height == 0


def test_effective_ratio_by_strategy(home):
    f = queries.run_named_query(home, "effective_ratio_by_strategy")
    assert rows(f, "strategy", "runs", "trajectories", "effective", "effective_ratio", "tokens",
                "effective_per_1k_tokens") == [
        ("uniform", 1, 2, 2, 1.0, 20, 100.0),
        ("trace", 1, 12, 5, 0.4167, 160, 31.25),
    ]


def test_predictor_calibration_bins(home):
    f = queries.run_named_query(home, "predictor_calibration_bins", run_id="r1")
    assert rows(f, "kind", "bin", "predictions", "outcomes", "mean_pred", "mean_outcome", "gap") == [
        ("prefix", 5, 1, 1.0, 0.55, 1.0, 0.45),
        ("root", 0, 1, 2.0, 0.05, 0.0, -0.05),
        ("root", 1, 2, 4.0, 0.135, 0.25, 0.115),
        ("root", 9, 2, 5.0, 0.975, 1.0, 0.025),  # v_pred = 1.0 falls in the last bin
    ]


def test_predictor_scores_by_iteration(home):
    f = queries.run_named_query(home, "predictor_scores_by_iteration", run_id="r1")
    root = f.filter(pl.col("kind") == "root").row(0, named=True)
    # sum w * ((v - p)^2 + p (1 - p)) / sum w = (0.005 + 0.745 + 0.0288 + 0.0025 + 0) / 11
    assert root["brier"] == pytest.approx(0.7813 / 11, abs=1e-4)
    assert root["predictions"] == 5


def test_budget_by_depth(home):
    f = queries.run_named_query(home, "budget_by_depth", run_id="r1")
    assert rows(f, "anchor_depth", "trajectories", "trajectory_share", "tokens", "token_share", "effective") == [
        (0, 9, 0.75, 130, 0.8125, 3),
        (1, 3, 0.25, 30, 0.1875, 2),
    ]


def test_allocation_histogram(home):
    f = queries.run_named_query(home, "allocation_histogram", run_id="r1")
    assert rows(f, "m_alloc", "prompts") == [(0, 1), (2, 2), (3, 1)]


def test_iteration_summary(home):
    f = queries.run_named_query(home, "iteration_summary", run_id="r1")
    assert f["iteration"].to_list() == [0, 1]
    assert f["accuracy"].to_list() == [0.4, 0.5]
    assert f["accuracy_qa"].null_count() == 2


def test_unknown_query_lists_known_names(home):
    with pytest.raises(KeyError, match="wasted_by_iteration"):
        queries.run_named_query(home, "no_such_query")


@pytest.mark.parametrize("fmt", ["table", "csv", "parquet"])
def test_sql_command_formats(home, tmp_path, fmt):
    out = tmp_path / "out.parquet" if fmt == "parquet" else None
    text = queries.sql_command("wasted_by_iteration", run_id="r1", fmt=fmt, home_dir=home, output=out)
    if fmt == "table":
        assert "wasted_share" in text and "0.6667" in text
    elif fmt == "csv":
        assert text.splitlines()[0].startswith("run_id,strategy,iteration")
        assert len(text.splitlines()) == 3
    else:
        assert pl.read_parquet(out).height == 2 and "2 rows" in text


def test_queries_on_an_empty_store(tmp_path):
    for name in queries.list_queries():
        assert queries.run_named_query(tmp_path, name).height == 0, name


def test_group_view_agrees_with_trajectory_view(home):
    per_traj = query(home, "SELECT run_id, iteration, anchor_depth, count(*) AS n, "
                           "count(*) FILTER (WHERE wasted) AS w, sum(tokens) AS t, "
                           "sum(tokens) FILTER (WHERE effective) AS et "
                           "FROM trajectories GROUP BY ALL ORDER BY ALL")
    per_group = query(home, "SELECT run_id, iteration, anchor_depth, sum(trajectories) AS n, "
                            "sum(trajectories - effective) AS w, sum(tokens) AS t, sum(effective_tokens) AS et "
                            "FROM trajectory_groups GROUP BY ALL ORDER BY ALL")
    assert per_traj.cast({c: pl.Int64 for c in ("n", "w", "t", "et")}).fill_null(0).rows() == \
        per_group.cast({c: pl.Int64 for c in ("n", "w", "t", "et")}).fill_null(0).rows()


def test_python_metric_agrees_with_the_views(home):
    """One effective-ratio definition: trace_core.metrics (the flow's number) equals the SQL views."""
    from trace_core.metrics import trajectory_table

    nodes = query(home, "SELECT * FROM nodes WHERE run_id = 'r1'")
    ours = trajectory_table(nodes).select("trajectory_id", "effective").sort("trajectory_id")
    views = query(home, "SELECT trajectory_id, effective FROM trajectories WHERE run_id = 'r1' ORDER BY 1")
    assert ours.rows() == views.rows()


def test_confident_allocation_by_iteration(home):
    f = queries.run_named_query(home, "confident_allocation_by_iteration", run_id="r1")
    # A (v 0.5, m 2) is not confident; B (v 0.02, m 2, 0/2) confirmed; D (v 0.97, m 3, 2/3) not
    assert rows(f, "iteration", "rollouts", "confident_rollouts", "confirmed_rollouts", "confirmed_share") == [
        (0, 7, 5, 2, 0.2857)]
