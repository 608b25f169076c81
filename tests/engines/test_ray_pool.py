"""The Ray rollout pool on a real local Ray (2 CPUs): results do not depend on the number of
workers, workers follow new checkpoints, and a worker killed mid-stage loses nothing."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from iteration_stages import run_until_verified
from node_digest import node_digest

from trace_core.config import load_train_config
from trace_core.engines.pool import RolloutPool, shard_groups
from trace_core.policy.model import TINY_WARM_DIR

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LOGPROB_COLS = {"action_logprobs", "mean_logprob", "min_logprob"}
pytestmark = [pytest.mark.ray, pytest.mark.slow,
              pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                 reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray for the module (~5 s to start); pools started inside it leave it running."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _cfg(workers: int, *extra: str):
    return load_train_config(CONFIGS / "small-ci.yaml",
                             ["run.iterations=2", "run.threads=1", f"run.rollout_workers={workers}", *extra])


def _same_nodes(a: pl.DataFrame, b: pl.DataFrame) -> None:
    """Identical node tables (row order included), except that log-probs may differ by float32
    rounding: a worker's batches have other shapes than the in-process batch (measured <= 4e-6)."""
    assert a["node_id"].to_list() == b["node_id"].to_list()
    da, db = node_digest(a), node_digest(b)
    assert {k for k in da if da[k] != db[k]} <= LOGPROB_COLS
    la = np.concatenate([np.asarray(x, dtype=float) for x in a["action_logprobs"].to_list() if x])
    lb = np.concatenate([np.asarray(x, dtype=float) for x in b["action_logprobs"].to_list() if x])
    np.testing.assert_allclose(la, lb, rtol=0, atol=1e-4)


def test_shard_groups_keeps_equal_keys_together_and_balances():
    shards = shard_groups(["a", "b", "a", "c", "d"], [3, 2, 3, 2, 1], 2)
    assert sorted(i for s in shards for i in s) == [0, 1, 2, 3, 4]
    assert any({0, 2} <= set(s) for s in shards) and all(s == sorted(s) for s in shards)
    assert sorted(sum([3, 2, 3, 2, 1][i] for i in s) for s in shards) == [5, 6]
    assert shard_groups(["a"], [1], 4) == [[0]]


def test_node_table_same_for_0_1_2_workers_and_after_an_update(ray_local, tmp_path):
    """Stages 1-7 of iteration 0, then the raw rollouts of iteration 1 from the updated checkpoint:
    1 worker gives exactly the in-process table, 2 workers the same up to log-prob rounding."""
    from trace_core.runtime import Runtime
    from trace_core.stages import iteration as it
    from trace_core.stages.run import RunRef, initial_checkpoint

    out = {}
    for w in (0, 1, 2):
        cfg = _cfg(w)
        ref = RunRef(str(tmp_path / f"w{w}"), "pool")
        ck0 = initial_checkpoint(cfg)
        with Runtime(cfg) as rt:  # closing it stops its actors: they hold the module's 2 CPUs
            before = it.evaluate(cfg, ck0, rt)
            res = run_until_verified(ref, cfg, ck0, before, rt)
            ck1 = it.update_policy(ref, cfg, 0, ck0, res["verified"], rt).checkpoint
            pred = it.refresh_predictor(ref, cfg, 1, before)
            raw1 = it.generate_raw_rollouts(ref, cfg, 1, ck1, it.allocate_roots(ref, cfg, 1, pred), rt)
            out[w] = (before, pl.read_parquet(res["verified"].nodes), pl.read_parquet(raw1.path))
            if w:  # each worker loaded the first checkpoint once, then the updated one once
                pool = rt.rollouts
                assert isinstance(pool, RolloutPool) and pool.size == w
                loads = ray_local.get([a.checkpoints.remote() for a in pool.actors])
                assert loads == [[ck0, ck1]] * w
    for w in (1, 2):
        assert out[w][0].accuracy == out[0][0].accuracy and out[w][0].cells == out[0][0].cells
        assert out[w][1].filter(pl.col("origin") == "extension").height > 0
        for a, b in zip(out[0][1:], out[w][1:], strict=True):
            _same_nodes(a, b)
            if w == 1:
                assert node_digest(a) == node_digest(b)


def test_a_worker_killed_mid_stage_loses_and_duplicates_nothing(ray_local, tmp_path):
    from trace_core.runtime import rollout_config
    from trace_core.stages.prompt_pools import candidate_pool
    from trace_core.stages.run import initial_checkpoint

    cfg = _cfg(2)
    ck = initial_checkpoint(cfg)
    tasks = list(candidate_pool(cfg, 0))[:6]
    kw = {"tasks": tasks, "counts": [2] * len(tasks), "sampling": cfg.sampling, "cfg": rollout_config(cfg),
          "seed": 7, "run_id": "kill", "iteration": 0}
    pool = RolloutPool(cfg)
    try:
        reference = pool.raw(ck, **kw)
        first = pool.actors[0]
        pool.last_stage = None
        got: dict = {}
        thread = threading.Thread(target=lambda: got.update(nodes=pool.raw(ck, **kw)))
        thread.start()
        while pool.last_stage is None:  # set once the shards are submitted
            time.sleep(0.01)
        ray_local.kill(first)  # while its shard runs
        thread.join(timeout=300)
        assert pool.restarts == 1 and first not in pool.actors and len(pool.actors) == 2
        nodes = got["nodes"]
        assert nodes["node_id"].n_unique() == nodes.height == reference.height
        assert node_digest(nodes) == node_digest(reference)
    finally:
        pool.close()


def test_workers_in_their_own_interpreter_and_bad_settings(ray_local):
    """``ray.worker_python`` starts the actors with that interpreter (here the same one)."""
    cfg = _cfg(1, f"ray.worker_python={sys.executable}")
    pool = RolloutPool(cfg)
    try:
        assert len(pool.actors) == 1 and ray_local.get(pool.actors[0].pid.remote()) > 0
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="did not start within"):  # 3 one-CPU workers on 2 CPUs
        RolloutPool(_cfg(3, "ray.start_timeout_s=3"))
    with pytest.raises(ValueError, match="rollout_workers"):
        load_train_config(CONFIGS / "small-ci.yaml", ["run.rollout_workers=-1"])
