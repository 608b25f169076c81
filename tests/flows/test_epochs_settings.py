"""The epochs settings (configs/learning-epochs*.yaml): their shape, and a comparison in them
shrunk to seconds — candidates come from the fixed training set, prompts recur across
iterations, TRACE predicts seen prompts from their record, held-out stays apart."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from trace_core.config import load_train_config
from trace_core.policy.model import TINY_WARM_DIR
from trace_core.stages.prompt_pools import candidate_pool, heldout_pool, training_set

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EPOCHS = ["learning-epochs.yaml", "learning-epochs-192.yaml"]


@pytest.mark.parametrize("name", EPOCHS)
def test_the_training_set_recurs_and_the_heldout_set_stays_apart(name):
    cfg = load_train_config(CONFIGS / name)
    train = training_set(cfg)
    assert len(train) == cfg.run.train_prompts == cfg.run.candidate_pool  # every prompt a candidate each step
    assert {t.prompt_id for t in candidate_pool(cfg, 3)} == {t.prompt_id for t in train}
    # GRPO with groups of 4 (the best uniform baseline) goes over it >= 3 times in the run
    assert cfg.run.iterations * cfg.allocation.budget_total / 4 >= 3 * len(train)
    held = heldout_pool(cfg)
    assert not {t.prompt_id for t in held} & {t.prompt_id for t in train}
    # the generators' smallest cells (single-digit sums) can repeat a training task word for word:
    # bounded to those, and to < 3% of the held-out set
    same = {(t.family, t.question, repr(sorted(t.payload.items()))) for t in train}
    repeats = [t for t in held if (t.family, t.question, repr(sorted(t.payload.items()))) in same]
    assert len(repeats) < 0.03 * len(held) and {(t.family, t.difficulty) for t in repeats} <= {("math", 0)}


def test_the_192_setting_leaves_the_planner_room_to_choose():
    cfg = load_train_config(CONFIGS / "learning-epochs-192.yaml")
    # groups of 4 take 48 of the 256 prompts a step: a quarter, so choosing which 48 can matter
    assert (cfg.allocation.budget_total / 4) / cfg.run.candidate_pool <= 0.25


@pytest.mark.slow
@pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                    reason="shipped tiny checkpoint missing: run `trace-rl warmup`")
def test_a_comparison_in_the_epochs_setting(prefect_server, tmp_path):
    from flows.compare import compare_flow
    from trace_core.store import query

    cfg = load_train_config(CONFIGS / "learning-epochs-192.yaml", [
        "run.iterations=2", "run.train_prompts=8", "run.candidate_pool=8", "allocation.budget_total=24",
        "run.eval_tasks=12", "run.eval_every=0", "run.probe_tasks=4", "tracking.log_model=false"])
    compare_flow(cfg, strategies=["grpo@4", "trace"], seeds=1, home=str(tmp_path), run_id="ep")
    train = {t.prompt_id for t in training_set(cfg)}
    roots = query(str(tmp_path), "select run_id, iteration, prompt_id from trajectory_groups "
                                 "where origin = 'raw'")
    assert set(roots["prompt_id"].to_list()) <= train
    for run, rows in roots.group_by("run_id"):
        first, second = (set(rows.filter(pl.col("iteration") == i)["prompt_id"].to_list()) for i in (0, 1))
        assert first & second, f"{run}: no prompt sampled in both iterations"
    # TRACE's iteration 1 predicts prompts it sampled at iteration 0, with their outcomes scored after
    preds = query(str(tmp_path), "select prompt_id, v_pred, outcome from scored_predictions('ep-trace-s0') "
                                 "where kind = 'root' and iteration = 1")
    seen = set(roots.filter((pl.col("run_id") == "ep-trace-s0") & (pl.col("iteration") == 0))["prompt_id"].to_list())
    assert seen & set(preds["prompt_id"].to_list())
    ev = query(str(tmp_path), "select run_id, iteration, episodes from evaluations "
                              "where split = 'heldout' and family = 'all'")
    assert ev.height == 4 and set(ev["episodes"].to_list()) == {len(heldout_pool(cfg)) * cfg.run.eval_samples}
