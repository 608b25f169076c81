"""kill -9 in the middle of a training run, then the same command: finished stages come from
the cache, the node set equals an uninterrupted run's, no node is duplicated, and the MLflow
run continues with continuous steps. Real subprocesses, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]
VOLATILE = ["created_at", "gen_seconds"]


def _cmd(home: Path, run_id: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs" / "small-ci.yaml"),
            "--run-id", run_id, "--home", str(home), "--set", "run.threads=1"]


def _env(state: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(state / "prefect"),
               XDG_CONFIG_HOME=str(state / "xdg"), PREFECT_LOGGING_LEVEL="INFO")
    env.pop("PREFECT_API_URL", None)  # each run starts its own temporary server, as a user's would
    return env


def _nodes(home: Path, run_id: str) -> pl.DataFrame:
    files = sorted((home / "shards" / "nodes" / f"run_id={run_id}").glob("iteration=*/final.parquet"))
    return pl.concat([pl.read_parquet(f) for f in files]).drop(VOLATILE).sort("node_id")


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    killed_home, clean_home = tmp_path / "killed", tmp_path / "clean"
    env = _env(tmp_path)
    # 1. start, wait until iteration 1's raw rollouts are on disk, then SIGKILL the whole group
    proc = subprocess.Popen(_cmd(killed_home, "r"), env=env, cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed_home / "runs" / "r" / "staging" / "iter=00001" / "raw.parquet"
    deadline = time.time() + 900
    while not marker.exists():
        assert proc.poll() is None, "training ended before the kill point"
        assert time.time() < deadline, "kill point not reached in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed_home / "shards" / "iterations" / "run_id=r" / "iteration=00001").exists()
    finished = sorted((killed_home / "runs" / "r" / "staging").glob("iter=*/*.parquet"))
    stamps = {p: p.stat().st_mtime_ns for p in finished}
    # 2. the same command resumes and finishes
    resumed = subprocess.run(_cmd(killed_home, "r"), env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Cached" in resumed.stdout + resumed.stderr  # finished stages were replayed, not rerun
    assert {p: p.stat().st_mtime_ns for p in finished} == stamps  # ... and their outputs not rewritten
    # 3. an uninterrupted run with the same run id and seed in another home
    clean = subprocess.run(_cmd(clean_home, "r"), env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert clean.returncode == 0, clean.stderr[-3000:]

    a, b = _nodes(killed_home, "r"), _nodes(clean_home, "r")
    assert a["node_id"].n_unique() == a.height
    assert a.height == b.height and a.equals(b)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{killed_home / 'mlflow.db'}")
    mlflow_run = (killed_home / "runs" / "r" / "mlflow_run_id").read_text().strip()
    steps = sorted(m.step for m in client.get_metric_history(mlflow_run, "effective/ratio"))
    assert steps == [0, 1]  # step = the store's iteration, each once across the kill
