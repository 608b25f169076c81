"""Test-wide environment: Prefect, MLflow and XDG state stay inside a per-session temporary
directory, telemetry is off, torch runs on one CPU thread. Set before anything imports prefect,
mlflow or torch."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_STATE = Path(tempfile.mkdtemp(prefix="trace-rl-tests-"))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ["PREFECT_HOME"] = str(_STATE / "prefect")
os.environ["XDG_CONFIG_HOME"] = str(_STATE / "xdg")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# One torch thread: the tiny model's ops are too small to split, and on a shared 2-core box a second
# thread waits for a core (measured: one iteration's stages 37 s on two threads, 6 s on one, at load
# ~3-5). A config's run.threads still applies inside its test; the next test starts on one again.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _torch_threads_as_the_session_started():
    """Undo a test's torch.set_num_threads (a config's run.threads), so it does not leak into the next."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)
