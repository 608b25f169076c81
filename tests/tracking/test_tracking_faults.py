"""Tracking under kills, outages and full disks, with real processes and a real MLflow store
(kills, outages, full disks; the model logged exactly once): after any of them the run has one
MLflow run, each (key, step) once and at most one logged model and registered version."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from trace_core.config import load_train_config
from trace_core.config.tracking import TrackingConfig
from trace_core.stages.run import RunRef
from tracking.journal import Journal
from tracking.mlflow_tracker import Tracker
from tracking.sqlite_store import half_made

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(retry_initial_s=0.05, retry_max_s=0.5)

# One session of a tracker in its own process: params, metrics of steps FIRST..LAST (logged once
# per step across sessions), optionally the final model; then finish.
SESSION = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from tracking.mlflow_tracker import Tracker
    from trace_core.config.tracking import TrackingConfig
    home, first, last, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    tr = Tracker(home, "r", config=TrackingConfig(retry_initial_s=0.05, retry_max_s=0.5))
    tr.log_params({"lr": 0.001})
    for step in range(first, last + 1):
        tr.log_metrics_once({"loss": 1.0 / (step + 1), "ratio": 0.5}, step)
    print("queued", flush=True)
    if model != "-":
        from tracking.registry import model_files
        staged = model_files(model, tr.run_dir / "model" / "checkpoint")
        cfg = tr.run_dir / "config.yaml"
        cfg.write_text("model: {}\\n")
        tr.log_model(staged, cfg, registered_model_name="fault-policy")
    print("finished", tr.finish(timeout=600), flush=True)
""")


def _session(home: Path, first: int, last: int, model: str = "-") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", SESSION, str(home), str(first), str(last), model], cwd=home,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _wait_for(proc: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    lines: list[str] = []
    found = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), "".join(lines[-30:])
    return lines


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "finished True" in out, out[-3000:]
    return out


def _mlflow_state(home: Path) -> dict:
    """What the local store holds for run id ``r``: MLflow runs, (key, step) counts, models."""
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()], "tags.`trace_rl.run_id` = 'r'")
    counts: Counter = Counter()
    models, versions = [], []
    for run in runs:
        for key in run.data.metrics:
            counts.update((key, m.step) for m in c.get_metric_history(run.info.run_id, key))
        models += list(c.search_logged_models([run.info.experiment_id],
                                              filter_string=f"source_run_id = '{run.info.run_id}'"))
        versions += [v for v in c.search_model_versions(f"run_id = '{run.info.run_id}'")]
    return {"runs": len(runs), "counts": counts, "models": [str(m.status) for m in models],
            "versions": len(versions), "params": runs[0].data.params if runs else {}}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -------------------------------------------------------------------------- kill while creating mlflow.db
@pytest.mark.slow
def test_kill_while_mlflow_creates_its_database(tmp_path):
    proc = _session(tmp_path, 0, 2)
    _wait_for(proc, "Creating initial MLflow database tables")
    time.sleep(1.5)
    assert proc.poll() is None, "the database was made before the kill: nothing tested"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    db = tmp_path / "mlflow.db"
    assert not db.exists() or not half_made(db), "a half-migrated mlflow.db is in place"
    _finish(_session(tmp_path, 0, 4))  # the resumed run logs steps 0..4 again
    state = _mlflow_state(tmp_path)
    assert state["runs"] == 1 and state["params"] == {"lr": "0.001"}
    assert state["counts"] == Counter({(k, s): 1 for k in ("loss", "ratio") for s in range(5)})
    assert not list(tmp_path.glob(".mlflow.db.*.tmp*"))  # no temporary database left behind


def test_half_made_database_of_an_older_version_is_rebuilt(tmp_path, caplog):
    db = tmp_path / "mlflow.db"
    with contextlib.closing(sqlite3.connect(db)) as con:  # what a kill mid-migration left before
        con.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("CREATE TABLE _alembic_tmp_experiments (x INTEGER)")
        con.execute("CREATE TABLE alembic_version (version_num TEXT)")
        con.execute("INSERT INTO alembic_version VALUES ('451aebb31d03')")
        con.commit()
    tr = Tracker(tmp_path, "r", config=TrackingConfig(**FAST))
    tr.log_metrics_once({"loss": 1.0}, 0)
    assert tr.finish(timeout=300), tr.last_error
    assert "half-created" in caplog.text and list(tmp_path.glob("mlflow.db.half-made-*"))
    assert _mlflow_state(tmp_path)["counts"] == Counter({("loss", 0): 1})


KILLED_WRITER = textwrap.dedent("""
    import os, sqlite3, sys
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("PRAGMA cache_size=10")  # pages spill to the file: the journal becomes hot
    con.execute("BEGIN IMMEDIATE")
    con.execute("CREATE TABLE scratch (v TEXT)")
    for i in range(20000):
        con.execute("INSERT INTO scratch VALUES (?)", (str(i) * 20,))
    os.kill(os.getpid(), 9)
""")


def test_a_store_whose_writer_was_killed_mid_transaction_is_kept(tmp_path, caplog):
    tr = Tracker(tmp_path, "r", config=TrackingConfig(**FAST))
    tr.log_metrics_once({"loss": 1.0}, 0)
    assert tr.finish(timeout=300), tr.last_error
    db = tmp_path / "mlflow.db"
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)], check=False)
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0  # a hot journal: a read-only open fails on it
    tr2 = Tracker(tmp_path, "r", config=TrackingConfig(**FAST))
    tr2.log_metrics_once({"loss": 0.5}, 1)
    assert tr2.finish(timeout=300), tr2.last_error
    assert "half-created" not in caplog.text and not list(tmp_path.glob("mlflow.db.half-made-*"))
    state = _mlflow_state(tmp_path)
    assert state["runs"] == 1 and state["counts"] == Counter({("loss", 0): 1, ("loss", 1): 1})
    with contextlib.closing(sqlite3.connect(db)) as con:  # the killed transaction was rolled back
        assert not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'scratch'").fetchone()


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_full_disk_while_mlflow_creates_its_database(small_tmpfs):
    home = small_tmpfs
    tr = Tracker(home, "r", config=TrackingConfig(**FAST))
    tr.log_params({"lr": 0.001})
    for step in range(3):
        tr.log_metrics_once({"loss": 1.0 / (step + 1)}, step)
    deadline = time.monotonic() + 120  # 700 KiB: smaller than the database (~930 KiB)
    while not any(w in (tr.last_error or "").lower() for w in ("full", "disk")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "full" in (tr.last_error or "").lower() or "disk" in (tr.last_error or "").lower(), tr.last_error
    assert not tr.flush(timeout=1.0) and tr.pending > 0  # nothing was lost: the records wait
    assert not (home / "mlflow.db").exists() or not half_made(home / "mlflow.db")
    tr.finish(timeout=1)
    subprocess.run(["mount", "-o", "remount,size=32m", str(home)], check=True)  # space freed
    tr2 = Tracker(home, "r", config=TrackingConfig(**FAST))
    for step in range(4):
        tr2.log_metrics_once({"loss": 1.0 / (step + 1)}, step)
    assert tr2.finish(timeout=300), tr2.last_error
    state = _mlflow_state(home)
    assert state["runs"] == 1 and state["params"] == {"lr": "0.001"}
    assert state["counts"] == Counter({("loss", s): 1 for s in range(4)})


# -------------------------------------------------------------------------- outage, then replay, exactly once
@pytest.mark.slow
def test_outage_then_resume_logs_each_step_and_the_model_once(tmp_path):
    from trace_core.policy.config import TINY_WARM_DIR

    if not (TINY_WARM_DIR / "config.json").is_file():
        pytest.skip("shipped tiny checkpoint missing")
    down = TrackingConfig(tracking_uri=f"http://127.0.0.1:{_closed_port()}", **FAST)
    tr = Tracker(tmp_path, "r", config=down)
    for step in range(3):
        assert tr.log_metrics_once({"loss": 1.0 / (step + 1), "ratio": 0.5}, step)
    assert not tr.finish(timeout=1.0)  # still down: the records stay in the journal
    # the resumed run, tracking back (the local store): it replays the journal and logs steps
    # 0..3 again, then the final model; a re-run of the finished run id does all of it once more
    _finish(_session(tmp_path, 0, 3, model=str(TINY_WARM_DIR)))
    _finish(_session(tmp_path, 0, 3, model=str(TINY_WARM_DIR)))
    state = _mlflow_state(tmp_path)
    assert state["runs"] == 1
    assert state["counts"] == Counter({(k, s): 1 for k in ("loss", "ratio") for s in range(4)})
    assert state["models"] == ["READY"] and state["versions"] == 1


@pytest.mark.slow
def test_kill_during_model_logging_leaves_one_model(tmp_path):
    from trace_core.policy.config import TINY_WARM_DIR

    if not (TINY_WARM_DIR / "config.json").is_file():
        pytest.skip("shipped tiny checkpoint missing")
    _finish(_session(tmp_path, 0, 1))  # the store exists: the next session reaches the model quickly
    proc = _session(tmp_path, 0, 1, model=str(TINY_WARM_DIR))
    db, t0 = tmp_path / "mlflow.db", time.monotonic()
    seen = []
    while time.monotonic() - t0 < 120 and proc.poll() is None and not seen:
        with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(db, timeout=1)) as con:
            seen = con.execute("SELECT status FROM logged_models").fetchall()
        time.sleep(0.02)
    assert seen and proc.poll() is None, "the model was not being logged"
    os.killpg(proc.pid, signal.SIGKILL)  # while its files are uploaded
    proc.wait()
    _finish(_session(tmp_path, 0, 2, model=str(TINY_WARM_DIR)))  # the resumed run ends and logs the model
    state = _mlflow_state(tmp_path)
    assert state["models"] == ["READY"] and state["versions"] == 1, state
    assert state["counts"] == Counter({(k, s): 1 for k in ("loss", "ratio") for s in range(3)})


# -------------------------------------------------------------------------- markers written atomically, read defensively
def test_empty_or_torn_marker_files_do_not_break_a_resume(tmp_path):
    import tracking.run_tracker as rt

    cfg = load_train_config(ROOT / "configs" / "small-ci.yaml", ["tracking.tracking_uri=http://127.0.0.1:9"])
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    for name in ("tracked_step", "tracked_step.wall", "mlflow_sent", "mlflow_run_id"):
        (run_dir / name).write_text("")  # killed between truncate and write, or the disk was full
    (run_dir / "mlflow_steps.json").write_text('{"": ')
    (run_dir / "mlflow_pending.jsonl").write_text(json.dumps({"op": "metrics", "step": 1, "ts": 5, "values": {"a": 1.0},
                                                              "seq": 0, "group": ""}) + "\n" + '{"op": "metr')
    tracker = rt.RunTracker(RunRef(str(tmp_path), "r"), cfg)
    tracker.log({"effective/ratio": 0.5}, step=1)  # journaled by the earlier session: not again
    tracker.log({"effective/ratio": 0.5}, step=2)
    tracker.log({"time/iteration_s": 3.0}, step=1, group="wall")
    assert tracker.tracker.logged_step("") == 2 and tracker.tracker.logged_step("wall") == 1
    tracker.tracker.finish(timeout=0.5)
    ops = Journal(run_dir).load()
    assert [(op["op"], op.get("group"), op.get("step")) for op in ops if op["op"] == "metrics"] == [
        ("metrics", "", 1), ("metrics", "", 2), ("metrics", "wall", 1)]
    assert not list(run_dir.glob(".*.tmp"))
