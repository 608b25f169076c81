"""``predictor.zero_variance_rest``: a prompt whose last raw group, within the window, failed or
succeeded every episode is planned at 0 or 1 (left out), read from the run's own node shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from trace_core.allocation.strategies import run_label
from trace_core.config import load_train_config
from trace_core.home.layout import shard_path, write_parquet_atomic
from trace_core.nodes import nodes_frame
from trace_core.stages import iteration as it
from trace_core.stages.rest import last_raw_rates, rest_zero_variance
from trace_core.stages.run import RunRef

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _leaves(run_id: str, iteration: int, prompt_id: str, rewards: list[float], version: int) -> list[dict]:
    return [{"run_id": run_id, "iteration": iteration, "node_id": f"{prompt_id}-{iteration}-{k}",
             "prompt_id": prompt_id, "trajectory_id": f"{prompt_id}-{iteration}-{k}", "origin": "raw",
             "is_leaf": True, "reward": r, "policy_version": version, "task": "math", "difficulty": 0, "depth": 1}
            for k, r in enumerate(rewards)]


def test_rest_sets_zero_variance_prompts_to_their_extreme():
    v = np.array([0.4, 0.5, 0.6, 0.7])
    out = rest_zero_variance(v, ["a", "b", "c", "d"], {"a": 0.0, "b": 1.0, "c": 0.5})
    assert out.tolist() == [0.0, 1.0, 0.6, 0.7]  # a mixed last group and no record keep the prediction


def test_the_plan_leaves_out_the_prompts_resting_in_the_window(tmp_path):
    overrides = ["run.eval_tasks=0", "run.train_prompts=8", "run.candidate_pool=8", "allocation.budget_total=16",
                 "allocation.strategy=trace"]
    cfg = load_train_config(CONFIGS / "small-ci.yaml", overrides)
    rest = load_train_config(CONFIGS / "small-ci.yaml", [*overrides, "predictor.zero_variance_rest=2"])
    ref = RunRef(str(tmp_path / "home"), "rest")
    ids = [t.prompt_id for t in it.candidate_pool(cfg, 3)]
    a, b, c, d, e = ids[:5]
    by_iter = {0: _leaves("rest", 0, c, [0.0, 0.0], 0),  # all failed, but before the window (iterations 1, 2)
               1: _leaves("rest", 1, a, [0.0, 0.0], 1) + _leaves("rest", 1, b, [1.0, 1.0], 1)
               + _leaves("rest", 1, d, [1.0, 1.0], 1),
               2: _leaves("rest", 2, d, [1.0, 0.0], 2)  # d's last group held a contrast
               + _leaves("rest", 2, e, [0.0, 0.0], 9)}  # from weights the plan may not read: ignored
    for i, rows in by_iter.items():
        write_parquet_atomic(nodes_frame(rows), shard_path(ref.home, "nodes", ref.run_id, "final", i))
    assert last_raw_rates(ref, 3, 2, max_version=3) == {a: 0.0, b: 1.0, d: 0.5}
    pred = it.refresh_predictor(ref, cfg, 0)
    plain = pl.read_parquet(it.allocate_roots(ref, cfg, 3, pred).prompts)
    rested = pl.read_parquet(it.allocate_roots(ref, rest, 3, pred).prompts)
    eps = cfg.allocation.min_prob
    v0, v1 = dict(zip(ids, plain["v_pred"], strict=True)), dict(zip(ids, rested["v_pred"], strict=True))
    assert np.isclose(v1[a], eps) and np.isclose(v1[b], 1 - eps)
    assert all(np.isclose(v1[p], v0[p]) for p in ids if p not in (a, b))
    m = dict(zip(ids, rested["m_alloc"], strict=True))
    assert m[a] == 0 and m[b] == 0 and rested["m_alloc"].sum() > 0


def test_the_run_label_names_the_rest():
    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["predictor.zero_variance_rest=4"])
    assert run_label(cfg.model_dump()).endswith("@rest4")


def test_cooldown_leaves_out_every_prompt_visited_in_the_window(tmp_path):
    """predictor.cooldown: a prompt with any raw group in the window, mixed ones too, is planned at
    the lower clip and not sampled; the others keep their predictions."""
    overrides = ["run.eval_tasks=0", "run.train_prompts=8", "run.candidate_pool=8", "allocation.budget_total=16",
                 "allocation.strategy=trace"]
    cfg = load_train_config(CONFIGS / "small-ci.yaml", overrides)
    cool = load_train_config(CONFIGS / "small-ci.yaml", [*overrides, "predictor.cooldown=2"])
    ref = RunRef(str(tmp_path / "home"), "cool")
    ids = [t.prompt_id for t in it.candidate_pool(cfg, 3)]
    a, b, c, d = ids[:4]
    by_iter = {0: _leaves("cool", 0, c, [1.0, 0.0], 0),  # before the window (iterations 1, 2)
               1: _leaves("cool", 1, a, [1.0, 0.0], 1), 2: _leaves("cool", 2, b, [1.0, 1.0], 2)
               + _leaves("cool", 2, d, [0.0, 1.0], 9)}  # from weights the plan may not read: ignored
    for i, rows in by_iter.items():
        write_parquet_atomic(nodes_frame(rows), shard_path(ref.home, "nodes", ref.run_id, "final", i))
    pred = it.refresh_predictor(ref, cfg, 0)
    plain = pl.read_parquet(it.allocate_roots(ref, cfg, 3, pred).prompts)
    cooled = pl.read_parquet(it.allocate_roots(ref, cool, 3, pred).prompts)
    v0, v1 = dict(zip(ids, plain["v_pred"], strict=True)), dict(zip(ids, cooled["v_pred"], strict=True))
    eps = cfg.allocation.min_prob
    assert np.isclose(v1[a], eps) and np.isclose(v1[b], eps)
    assert all(np.isclose(v1[p], v0[p]) for p in ids if p not in (a, b))
    m = dict(zip(ids, cooled["m_alloc"], strict=True))
    assert m[a] == 0 and m[b] == 0 and cooled["m_alloc"].sum() > 0
    assert run_label(cool.model_dump()).endswith("@cooldown2")
