"""One writer per run, with real processes: a live holder refuses a second
writer at once (the lock helper and ``trace-rl train``), a holder killed with SIGKILL leaves a
lock that the next writer takes over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_core.home.lock import LOCK_FILE, RunLocked, acquire_run_lock, hold_run_lock, release_run_lock

ROOT = Path(__file__).resolve().parents[2]
HOLD = "import sys, time; from trace_core.home.lock import acquire_run_lock; acquire_run_lock(sys.argv[1]); " \
       "print('held', flush=True); time.sleep(60)"


@pytest.fixture
def holder(tmp_path):
    """A separate Python process holding the lock of ``home/runs/r``."""
    run_dir = tmp_path / "home" / "runs" / "r"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc, run_dir
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_second_writer_is_refused_and_named(holder):
    proc, run_dir = holder
    info = json.loads((run_dir / LOCK_FILE).read_text())
    assert info["pid"] == proc.pid and info["host"]
    t0 = time.perf_counter()
    with pytest.raises(RunLocked, match=f"pid {proc.pid} on "):
        acquire_run_lock(run_dir)
    assert time.perf_counter() - t0 < 1.0


def test_lock_of_a_killed_holder_is_taken_over(holder):
    proc, run_dir = holder
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == proc.pid  # stale content stays
    fd = acquire_run_lock(run_dir)
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    release_run_lock(fd)


@pytest.mark.slow
def test_cli_train_is_refused_at_once_while_the_run_is_held(holder, tmp_path):
    proc, _ = holder
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--run-id", "r", "--home", str(tmp_path / "home")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"pid {proc.pid}" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert time.perf_counter() - t0 < 20  # before any Prefect server starts
    assert not (tmp_path / "home" / "prefect-results").exists()


def test_released_lock_is_free_again_in_process(tmp_path):
    with hold_run_lock(tmp_path / "r"):
        with pytest.raises(RunLocked):
            acquire_run_lock(tmp_path / "r")  # a second writer in the same process too
    release_run_lock(acquire_run_lock(tmp_path / "r"))
