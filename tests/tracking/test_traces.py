"""Trajectories as MLflow 3 traces: on the store fixture's run r1, iteration 1 (six
trajectories: a3, a4; d1, d2 of two turns; f1, f2 continuing d1 after its first turn)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_fixture import build_fixture_store  # noqa: E402

from trace_core.home.layout import shard_path  # noqa: E402
from trace_core.home.shards import read_shard  # noqa: E402
from tracking.traces import send_traces, trajectory_traces  # noqa: E402


def _iteration_nodes(home: Path) -> Path:
    """Both node shards of r1's iteration 1 in one (the flow's final shard holds them so)."""
    frames = [read_shard(p) for p in sorted((home / "shards" / "nodes" / "run_id=r1" / "iteration=00001").glob("*.parquet"))]
    path = shard_path(home, "nodes", "r1", "final", 1).with_name("merged.parquet")
    pl.concat(frames, how="diagonal_relaxed").write_parquet(path)
    return path


def test_trace_specs_follow_the_path_from_the_prompt(tmp_path):
    home = build_fixture_store(tmp_path)
    nodes = read_shard(_iteration_nodes(home))
    specs = trajectory_traces(nodes, cap=100, seed=0)
    assert sorted(s["attributes"]["trajectory_id"] for s in specs) == ["a3", "a4", "d1", "d2", "f1", "f2"]
    f1 = next(s for s in specs if s["attributes"]["trajectory_id"] == "f1")
    assert [t["name"] for t in f1["turns"]] == ["turn 1 (prefix)", "turn 2"]  # d1's first turn, then its own
    assert f1["reward"] == 1.0 and f1["attributes"]["origin"] == "extension"
    assert len(trajectory_traces(nodes, cap=4, seed=0)) == 4
    assert trajectory_traces(nodes, cap=4, seed=0) == trajectory_traces(nodes, cap=4, seed=0)  # seeded


def test_traces_land_in_the_run_with_reward_assessments(tmp_path, template_db):
    from mlflow import MlflowClient

    home = build_fixture_store(tmp_path / "home")
    shutil.copy(template_db, tmp_path / "mlflow.db")  # migrated once (tests/tracking/conftest.py)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("traces", artifact_location=(tmp_path / "mlartifacts").as_uri())  # not ./mlruns
    run = client.create_run(exp).info.run_id
    ids = send_traces(uri, run, exp, {"nodes": str(_iteration_nodes(home)), "cap": 4, "seed": 0})
    assert len(ids) == 4
    traces = client.search_traces(locations=[exp], run_id=run)
    assert sorted(t.info.trace_id for t in traces) == sorted(ids)
    for t in traces:
        tid = t.info.request_metadata.get("mlflow.traceInputs") or ""
        spans = t.data.spans
        root = next(s for s in spans if s.parent_id is None)
        turns = [s for s in spans if s.parent_id is not None]
        traj = root.attributes["trajectory_id"]
        assert len(turns) == {"a3": 1, "a4": 1}.get(traj, 2), (traj, tid)
        feedback = [a for a in t.info.assessments if a.name == "reward"]
        assert len(feedback) == 1 and feedback[0].value == {"a3": 1.0, "a4": 1.0, "f1": 1.0}.get(traj, 0.0)


def test_traces_during_an_outage_neither_wait_nor_double(tmp_path, template_db):
    """An iteration's traces record with a tracking server down: the call returns at once, the
    step counts as logged once journaled, and the next session sends it exactly once."""
    import socket
    import time

    from mlflow import MlflowClient

    from tracking import Tracker, TrackingConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    home = build_fixture_store(tmp_path / "home")
    nodes = _iteration_nodes(home)
    fast = dict(retry_initial_s=0.05, retry_max_s=0.2)
    down = Tracker(tmp_path, "r1", config=TrackingConfig(tracking_uri=f"http://127.0.0.1:{closed}", **fast))
    t0 = time.perf_counter()
    down.log_traces(nodes, cap=3, seed=0, step=1)
    assert time.perf_counter() - t0 < 0.5 and down.logged_step("traces") == 1
    assert not down.finish(timeout=1.0)  # still down: the record stays in the journal

    shutil.copy(template_db, tmp_path / "mlflow.db")  # the backend is back (here: the local store)
    up = Tracker(tmp_path, "r1", config=TrackingConfig(**fast))
    assert up.logged_step("traces") == 1  # a resumed run does not log iteration 1's traces again
    assert up.finish(timeout=120)
    exp = MlflowClient(up.tracking_uri).get_run(up.mlflow_run_id).info.experiment_id
    assert len(MlflowClient(up.tracking_uri).search_traces(locations=[exp], run_id=up.mlflow_run_id)) == 3
