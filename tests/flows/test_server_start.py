"""Commands started at once on a fresh Prefect home: their temporary servers start one at a time
(the first migrates the database), so none dies of a concurrent migration ("exited with code 3")."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVE = """
import httpx
from prefect.settings import PREFECT_API_URL
from flows.lifecycle import temporary_server
with temporary_server():
    print("health", httpx.get(PREFECT_API_URL.value() + "/health").status_code, flush=True)
"""
HOLD = """
import sys, time
from pathlib import Path
from flows.lifecycle import start_lock
with start_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _env(prefect_home: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(prefect_home),
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300")
    env.pop("PREFECT_API_URL", None)
    return env


def test_start_lock_makes_the_second_starter_wait(tmp_path):
    """A second holder of a home's start lock waits for the first (another process)."""
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), "3"], env=_env(tmp_path),
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    second = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path), "0"], env=_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    waited = time.monotonic() - t0
    first.wait(30)
    assert second.stdout.strip() == "held" and first.returncode == 0
    assert waited > 1.5, f"the second holder did not wait ({waited:.1f} s)"


@pytest.mark.slow
def test_servers_started_at_once_on_a_fresh_home_all_run(tmp_path):
    """Three temporary servers on one fresh home (without the lock two of three exited with code 3)."""
    home = tmp_path / "prefect"
    procs = [subprocess.Popen([sys.executable, "-c", SERVE], env=_env(home), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "health 200" in out, err[-2000:]


def test_a_server_that_does_not_answer_in_time_names_the_setting(tmp_path):
    """A start that outlasts the wait fails with one line naming the seconds and the setting that
    waits longer (a loaded machine starts the server slower)."""
    env = dict(_env(tmp_path / "prefect"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0")
    out = subprocess.run([sys.executable, "-c", SERVE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "health" not in out.stdout
    assert "did not answer within 0 s" in out.stderr
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in out.stderr
