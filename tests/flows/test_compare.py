"""Smoke test of `compare`: two strategies at equal budget from the same checkpoint and stream."""

from __future__ import annotations

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

    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.iterations=1"])
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
