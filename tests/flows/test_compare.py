"""Smoke test of `compare`: two strategies at equal budget from the same checkpoint and stream."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from trace_core.config import load_train_config
from trace_core.policy.model import TINY_WARM_DIR

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


def test_compare_two_strategies(prefect_server, tmp_path):
    from flows.compare import compare_flow

    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.iterations=1", "run.threads=1"])
    out = compare_flow(cfg, strategies=["grpo", "trace"], seeds=1, home=str(tmp_path),
                       run_id="cmp")
    assert [r["strategy"] for r in out["table"]] == ["grpo", "trace"]
    prompts = pl.read_parquet(tmp_path / "shards" / "prompts" / "run_id=cmp-*" / "**" / "final.parquet")
    # the same prompt stream for both strategies
    by = prompts.group_by("strategy").agg(pl.col("prompt_id").sort())
    assert by["prompt_id"][0].to_list() == by["prompt_id"][1].to_list()
    iters = pl.read_parquet(tmp_path / "shards" / "iterations" / "run_id=cmp-*" / "**" / "final.parquet")
    assert set(iters["budget_asked"].to_list()) == {cfg.allocation.budget_total}
    art = tmp_path / "runs" / "cmp" / "artifacts"
    assert (art / "compare.md").is_file() and (art / "effective_ratio_by_iteration.png").is_file()
    assert "| grpo |" in out["report"] and "| trace |" in out["report"]
    # children name their comparison, the printed report's images their directory, numbers
    # one style (no 2.04e+03 beside 3.91)
    from trace_core.store import query

    runs = query(tmp_path, "select run_id, parent_run_id from runs order by run_id")
    assert runs["parent_run_id"].to_list() == ["cmp", "cmp"], runs
    assert f"]({art}/effective_ratio_by_iteration.png)" in out["report"]
    assert not re.search(r"\d\.\d+e[+-]\d+", out["report"]), out["report"]
    # the parent run's params describe the model the children loaded (its config.json), as theirs do
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    params = {r.data.tags.get("mlflow.runName", r.info.run_name): r.data.params for r in found}
    assert set(params) == {"cmp", "cmp-grpo-s0", "cmp-trace-s0"}, set(params)
    model_keys = ("model.hidden_size", "model.num_layers", "model.head_dim", "model.path")
    assert {k: params["cmp"][k] for k in model_keys} == {k: params["cmp-trace-s0"][k] for k in model_keys}
    assert params["cmp"]["model.hidden_size"] == "128" and params["cmp"]["model.path"] == str(TINY_WARM_DIR)
    # the comparison's page leads with the outcome: learning curves (tokens, seconds) and the paired
    # table, then the budget; the iteration table holds only the columns strategies are compared by
    from tracking.html_report import comparison_children, render_comparison_report

    page = render_comparison_report(tmp_path, "cmp", comparison_children(tmp_path, "cmp"))
    titles = re.findall(r"<h2>([^<]*)</h2>", page)
    assert titles[:2] == ["Learning curves", "Budget: effective ratio by strategy"], titles
    learning = page[page.index("<h2>Learning curves</h2>"):page.index("<h2>Budget")]
    assert len(re.findall(r'src="data:image/png;base64,', learning)) == 2 and "(paired)" in learning
    assert ">timings<" not in page and ">accuracy_math<" not in page


@pytest.mark.ray
def test_compare_fanned_out_on_ray_equals_serial(prefect_server, tmp_path):
    """2 strategies x 1 seed as concurrent Ray tasks (prefect-ray) give the serial run's numbers."""
    from node_digest import node_digest
    from polars.testing import assert_frame_equal

    from flows.compare import compare_flow

    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.iterations=1", "run.eval_tasks=6", "run.threads=1"])
    out = {}
    for mode, parallel in (("serial", 0), ("fanned", 2)):
        out[mode] = compare_flow(cfg, strategies=["grpo", "trace"], seeds=1, home=str(tmp_path / mode),
                                 run_id="cmp", parallel=parallel)
    assert out["serial"]["runs"] == out["fanned"]["runs"]
    serial, fanned = (pl.DataFrame(out[m]["table"]).select(pl.exclude("^seconds.*$")) for m in ("serial", "fanned"))
    assert_frame_equal(serial, fanned)  # every metric but wall time (NaN CIs: one seed)
    for run in out["serial"]["runs"]:
        nodes = [pl.read_parquet(tmp_path / mode / "shards" / "nodes" / f"run_id={run}" / "**" / "final.parquet")
                 for mode in ("serial", "fanned")]
        assert node_digest(nodes[0]) == node_digest(nodes[1])


def test_learning_benchmark_smoke(prefect_server, tmp_path):
    """The learning benchmark's command (`compare` with evaluations along the way) on a tiny
    budget: the evaluations view holds the warm start and every evaluation, and the report leads
    with learning curves (accuracy at equal tokens, time-to-accuracy) and their plots."""
    from flows.compare import compare_flow
    from trace_core.stages.prompt_pools import heldout_pool
    from trace_core.store import query

    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.iterations=2", "run.eval_every=1",
                                                         "run.probe_tasks=4", "tracking.log_model=false", "run.threads=1"])
    out = compare_flow(cfg, strategies=["grpo", "grpo@2", "dapo", "trace"], seeds=1, home=str(tmp_path), run_id="lrn")
    ev = query(str(tmp_path), "select run_id, iteration, split, family, accuracy, episodes from evaluations")
    heldout = ev.filter((pl.col("split") == "heldout") & (pl.col("family") == "all"))
    assert sorted(set(heldout["iteration"].to_list())) == [0, 1, 2] and heldout.height == 12
    assert set(heldout["episodes"].to_list()) == {len(heldout_pool(cfg)) * cfg.run.eval_samples}
    assert ev.filter(pl.col("split") == "probe").height == 12
    md = out["report"]
    assert md.index("## Learning curves") < md.index("## Budget")
    assert "tokens to target" in md and "| dapo | 1 |" in md and "| grpo@2 | 1 |" in md  # a variant is its own row
    art = tmp_path / "runs" / "lrn" / "artifacts"
    for name in ("learning_tokens.png", "learning_seconds.png", "learning.csv", "learning_curves.csv"):
        assert (art / name).is_file(), name
    iters = query(str(tmp_path), "select run_id, sum(budget_used) as used from iterations group by 1")
    used = {r.removeprefix("lrn-").removesuffix("-s0"): u for r, u in iters.iter_rows()}
    assert used["grpo"] == used["grpo-2"] == used["trace"] == 2 * cfg.allocation.budget_total
    assert used["dapo"] >= used["grpo"]  # dynamic sampling pays for its refills
    sizes = query(str(tmp_path), "select run_id, max(group_size) as n from trajectory_groups where origin = 'raw' "
                                 "group by 1")
    assert {r: n for r, n in sizes.iter_rows() if r.startswith("lrn-grpo")} == {"lrn-grpo-s0": 4, "lrn-grpo-2-s0": 2}


def test_equal_tokens_benchmark_smoke(prefect_server, tmp_path):
    """The benchmark at equal tokens (`--set allocation.budget_tokens=T`): iteration 0 asks for
    budget_total trajectories, every later one for what the tokens still owed buy at the last
    iteration's tokens per trajectory, so both strategies' cumulative tokens track T x iterations."""
    from flows.compare import compare_flow
    from trace_core.allocation.planner import iteration_budget
    from trace_core.store import query

    tokens = 24 * 20
    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.iterations=3", "tracking.log_model=false",
                                                         f"allocation.budget_tokens={tokens}", "run.threads=1"])
    compare_flow(cfg, strategies=["grpo", "trace"], seeds=1, home=str(tmp_path), run_id="tok")
    rows = query(str(tmp_path), "select strategy, iteration, budget_asked, budget_used, tokens from iterations "
                                "order by strategy, iteration")
    for strategy in ("grpo", "trace"):
        r = rows.filter(pl.col("strategy") == strategy)
        assert r["budget_asked"][0] == cfg.allocation.budget_total
        for i in (1, 2):
            spent = int(r["tokens"][:i].sum())
            price = r["tokens"][i - 1] / r["budget_used"][i - 1]
            assert r["budget_asked"][i] == iteration_budget(cfg.allocation, i, spent, price), (strategy, i)
        assert all(u <= a for u, a in zip(r["budget_used"], r["budget_asked"], strict=True))
        assert 1.5 * tokens <= int(r["tokens"].sum()) <= 4.5 * tokens
