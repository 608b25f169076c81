"""Stage outputs lost after a run: a deleted node shard, a deleted
checkpoint and a truncated staging shard are found at resume, named in the log, and their
stages recomputed (with every later stage of that iteration), so the resumed run ends with the
files back and the same node table as the first run. The real flow on the tiny checkpoint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from node_digest import node_digest

from trace_core.config import load_train_config
from trace_core.policy.model import TINY_WARM_DIR

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


def _digest(home: Path, run_id: str) -> dict[str, str]:
    return node_digest(pl.read_parquet(home / "shards" / "nodes" / f"run_id={run_id}" / "**" / "final.parquet"))


def test_lost_outputs_are_recomputed_on_resume(prefect_server, tmp_path):
    from flows.train import train_flow

    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.iterations=2", "run.threads=1"])
    home, run = tmp_path / "home", tmp_path / "home" / "runs" / "r"
    train_flow(cfg, run_id="r", home=str(home))
    first = _digest(home, "r")

    final0 = home / "shards" / "nodes" / "run_id=r" / "iteration=00000" / "final.parquet"
    checkpoint0 = run / "checkpoints" / "iter=00000"
    raw1 = run / "staging" / "iter=00001" / "raw.parquet"
    kept = run / "staging" / "iter=00000" / "raw.parquet"  # nothing wrong with it: replayed, not rewritten
    stamp = kept.stat().st_mtime_ns
    final0.unlink()                                     # a deleted node shard
    shutil.rmtree(checkpoint0)                          # a deleted checkpoint
    os.truncate(raw1, raw1.stat().st_size // 2)         # a truncated shard

    out = train_flow(cfg, run_id="r", home=str(home))
    logged = "\n".join(out["recomputed"])  # the lines the flow logged as warnings
    assert [r["iteration"] for r in out["iterations"]] == [0, 1]
    assert final0.is_file() and (checkpoint0 / "model.safetensors").is_file()
    assert pl.read_parquet(raw1).height > 0
    assert kept.stat().st_mtime_ns == stamp
    assert _digest(home, "r") == first
    assert f"verify-rewards: output {final0} is missing" in logged
    assert f"generate-raw-rollouts: output {raw1} is unreadable" in logged

    # the latest checkpoint alone deleted: only its update (and what follows) reruns
    checkpoint1 = run / "checkpoints" / "iter=00001"
    shutil.rmtree(checkpoint1)
    again = train_flow(cfg, run_id="r", home=str(home))
    assert f"update-policy: output {checkpoint1} is missing" in "\n".join(again["recomputed"])
    assert (checkpoint1 / "model.safetensors").is_file()
    assert _digest(home, "r") == first
