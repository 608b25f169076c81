"""The MLflow Tracker against real backends: a local SQLite store, an unreachable server, a
locked and a missing database."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_fixture import build_fixture_store  # noqa: E402

from tracking import Tracker, TrackingConfig, publish_run_artifacts  # noqa: E402

FAST = dict(retry_initial_s=0.05, retry_max_s=0.2)
logging.getLogger("urllib3").setLevel(logging.ERROR)  # one line per refused connection otherwise


def client(uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def fresh_db(template: Path, path: Path) -> Path:
    """A copy of the session's migrated store (``template_db``, tests/tracking/conftest.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, path)
    return path


def steps(c, mlflow_run_id, key):
    return sorted((m.step, m.value) for m in c.get_metric_history(mlflow_run_id, key))


def artifact_paths(c, mlflow_run_id, path=None):
    out = []
    for f in c.list_artifacts(mlflow_run_id, path):
        out += artifact_paths(c, mlflow_run_id, f.path) if f.is_dir else [f.path]
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory, template_db):
    home = build_fixture_store(tmp_path_factory.mktemp("home"))
    fresh_db(template_db, home / "mlflow.db")
    return home


def test_run_with_params_metrics_and_artifacts_then_resume(home):
    config = {"run": {"seed": 3, "strategy": "trace"}, "budget": {"total": 64, "families": ["math", "qa"]}}
    tr = Tracker(home, "r1", config=TrackingConfig(**FAST))
    tr.log_params(config)
    for it in (0, 1):
        tr.log_metrics({"effective_ratio": 0.3 + it / 10, "loss": None}, step=it)
    files = publish_run_artifacts(tr, config)
    assert tr.finish(timeout=120)
    assert tr.healthy and tr.pending == 0
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in files if p.suffix == ".png")
    report = (tr.run_dir / "artifacts" / "report.md").read_text()
    assert "wasted_by_iteration" in report and "`plots/effective_ratio.png`" in report
    # MLflow's markdown view shows neither relative images nor JSON well:
    # the plots are named, the page with them is report.html, stage seconds are columns
    assert "![" not in report and "report.html" in report
    assert '{"rollout"' not in report and "Seconds per stage" in report and "| iteration | rollout |" in report
    assert b"data:image/png;base64," in (tr.run_dir / "artifacts" / "report.html").read_bytes()

    c = client(tr.tracking_uri)
    rid = (home / "runs" / "r1" / "mlflow_run_id").read_text()
    run = c.get_run(rid)
    assert run.info.status == "FINISHED"
    assert run.data.params["run.seed"] == "3" and run.data.params["budget.families"] == '["math", "qa"]'
    assert steps(c, rid, "effective_ratio") == [(0, 0.3), (1, pytest.approx(0.4))]
    assert "loss" not in run.data.metrics
    assert sorted(artifact_paths(c, rid)) == [
        "config.yaml", "plots/accuracy.png", "plots/allocation_histogram.png", "plots/calibration.png",
        "plots/effective_ratio.png", "report.html", "report.md",
    ]

    # resume: same run id -> same MLflow run, steps continue, same params accepted again
    tr2 = Tracker(home, "r1", config=TrackingConfig(**FAST))
    tr2.log_params(config)
    tr2.log_metrics({"effective_ratio": 0.5}, step=2)
    assert tr2.finish(timeout=60)
    assert tr2.mlflow_run_id == rid
    assert [s for s, _ in steps(c, rid, "effective_ratio")] == [0, 1, 2]
    assert c.get_run(rid).info.status == "FINISHED"


def test_compare_makes_nested_runs(home):
    with Tracker(home, "cmp", config=TrackingConfig(**FAST)) as parent:
        kids = [Tracker(home, f"cmp-{s}", parent=parent, config=TrackingConfig(**FAST)) for s in ("trace", "grpo")]
        for k in kids:
            k.log_metrics({"effective_ratio": 0.5}, step=0)
            assert k.finish(timeout=60)
    c = client(parent.tracking_uri)
    for k in kids:
        assert c.get_run(k.mlflow_run_id).data.tags["mlflow.parentRunId"] == parent.mlflow_run_id


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_buffers_warns_and_replays_later(tmp_path, caplog, template_db):
    uri = f"http://127.0.0.1:{_closed_port()}"
    tr = Tracker(tmp_path, "r9", config=TrackingConfig(tracking_uri=uri, **FAST))
    caplog.set_level(logging.WARNING, logger="tracking.mlflow_tracker")
    t0 = time.perf_counter()
    tr.log_params({"lr": 1e-3})
    for it in range(5):
        tr.log_metrics({"effective_ratio": it / 10}, step=it)
    assert time.perf_counter() - t0 < 0.5  # training never waits on the tracker
    assert not tr.finish(timeout=2.0)  # still down: not fatal, records kept
    assert not tr.healthy and tr.pending == 8  # open, params, 5 metrics, terminate
    assert "MLflow unavailable" in caplog.text
    assert (tmp_path / "runs" / "r9" / "mlflow_pending.jsonl").exists()

    # the backend comes back (here: the local store): the next session replays the buffer
    fresh_db(template_db, tmp_path / "mlflow.db")
    tr2 = Tracker(tmp_path, "r9", config=TrackingConfig(**FAST))
    tr2.log_metrics({"effective_ratio": 0.9}, step=5)
    assert tr2.finish(timeout=120)
    c = client(tr2.tracking_uri)
    assert [s for s, _ in steps(c, tr2.mlflow_run_id, "effective_ratio")] == [0, 1, 2, 3, 4, 5]
    assert c.get_run(tr2.mlflow_run_id).data.params == {"lr": "0.001"}
    assert not (tmp_path / "runs" / "r9" / "mlflow_pending.jsonl").exists()


def test_database_outage_then_recovery_in_the_same_session(tmp_path, caplog, template_db):
    db_dir = tmp_path / "mount"
    db_dir.write_text("")  # a file where the directory should be: the database cannot be opened
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{db_dir / 'mlflow.db'}", **FAST)
    caplog.set_level(logging.WARNING, logger="tracking.mlflow_tracker")
    tr = Tracker(tmp_path, "r7", config=cfg)
    for it in range(3):
        tr.log_metrics({"wasted_share": 0.5}, step=it)
    assert not tr.flush(timeout=1.0) and not tr.healthy
    db_dir.unlink()
    fresh_db(template_db, db_dir / "mlflow.db")  # the volume is back
    assert tr.flush(timeout=120) and tr.healthy
    assert "MLflow is back" in caplog.text
    assert tr.finish(timeout=30)
    assert [s for s, _ in steps(client(cfg.tracking_uri), tr.mlflow_run_id, "wasted_share")] == [0, 1, 2]


def test_locked_database_does_not_block_training(tmp_path, template_db):
    fresh_db(template_db, tmp_path / "mlflow.db")
    tr = Tracker(tmp_path, "r5", config=TrackingConfig(**FAST))
    tr.log_metrics({"loss": 1.0}, step=0)
    assert tr.flush(timeout=120)
    db = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None, check_same_thread=False)
    db.execute("BEGIN EXCLUSIVE")  # e.g. an analyst's long transaction
    t0 = time.perf_counter()
    for it in range(1, 20):
        tr.log_metrics({"loss": 1.0 / it}, step=it)
    assert time.perf_counter() - t0 < 0.5
    time.sleep(0.5)
    assert tr.pending > 0
    threading.Timer(0.5, lambda: (db.execute("COMMIT"), db.close())).start()
    assert tr.finish(timeout=60)
    assert len(steps(client(tr.tracking_uri), tr.mlflow_run_id, "loss")) == 20


def test_disabled_tracker_is_a_no_op(tmp_path):
    tr = Tracker(tmp_path, "off", config=TrackingConfig(enabled=False))
    tr.log_metrics({"x": 1.0}, step=0)
    assert tr.finish() and tr.pending == 0 and not (tmp_path / "mlflow.db").exists()


def test_interrupt_raised_in_the_worker_thread_is_retried_quietly(tmp_path, caplog, template_db, monkeypatch):
    """A SIGINT that stops a run surfaced once as a KeyboardInterrupt inside a polars query of the
    tracker's thread (reading a shard for the traces), with a traceback: now the record is kept
    and sent, no traceback, no "unavailable" warning, and the worker thread lives on."""
    fresh_db(template_db, tmp_path / "mlflow.db")
    tr = Tracker(tmp_path, "r4", config=TrackingConfig(**FAST))
    real, calls = Tracker._send, []

    def send(self, op):
        calls.append(op["op"])
        if op["op"] == "metrics" and calls.count("metrics") == 1:
            raise KeyboardInterrupt
        return real(self, op)

    monkeypatch.setattr(Tracker, "_send", send)
    caplog.set_level(logging.WARNING, logger="tracking.mlflow_tracker")
    tr.log_metrics({"loss": 0.5}, step=0)
    assert tr.flush(timeout=120) and tr.healthy and tr.failures == 0
    assert calls.count("metrics") == 2
    assert tr.finish(timeout=60)
    assert steps(client(tr.tracking_uri), tr.mlflow_run_id, "loss") == [(0, 0.5)]
    assert "MLflow" not in caplog.text
