"""A moved run home replays: cache keys and cached records hold paths relative
to the home, so a finished run moved to another directory and resumed there replays every stage
from its cache (no output rewritten, nothing recomputed, the same node table) and writes nothing
at the old location. The real flow on the tiny checkpoint."""

from __future__ import annotations

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


def _outputs(home: Path) -> dict[str, int]:
    """Stage outputs (staging shards, checkpoints, predictor states, node shards) and their mtimes."""
    files = [p for d in ("runs", "shards") for p in (home / d).rglob("*") if p.is_file()
             and not p.is_relative_to(home / "shards" / "runs")]  # the runs row: every run rewrites its status
    return {str(p.relative_to(home)): p.stat().st_mtime_ns for p in files
            if p.suffix in {".parquet", ".safetensors"}}


def _digest(home: Path) -> dict[str, str]:
    files = sorted((home / "shards" / "nodes").rglob("*.parquet"))
    return node_digest(pl.concat([pl.read_parquet(f, hive_partitioning=False) for f in files]))


def test_moved_home_replays_every_stage(prefect_server, tmp_path):
    from flows.train import train_flow

    cfg = load_train_config(CONFIGS / "small-ci.yaml", ["run.iterations=1", "run.threads=1"])
    old, new = tmp_path / "old-home", tmp_path / "elsewhere" / "home"
    first = train_flow(cfg, run_id="m", home=str(old))
    digest = _digest(old)
    new.parent.mkdir()
    shutil.move(old, new)
    before = _outputs(new)
    assert any(k.endswith("model.safetensors") for k in before)

    again = train_flow(cfg, run_id="m", home=str(new))
    assert again["recomputed"] == []
    assert _outputs(new) == before  # every stage replayed from the cache: nothing rewritten
    assert _digest(new) == digest
    assert again["iterations"][0]["effective_ratio"] == first["iterations"][0]["effective_ratio"]
    assert not old.exists()  # nothing written at the old location
