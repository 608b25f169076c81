"""Test-wide environment: Prefect, MLflow and XDG state stay inside a per-session temporary
directory, telemetry is off. Set before anything imports prefect or mlflow."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_STATE = Path(tempfile.mkdtemp(prefix="trace-rl-tests-"))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ["PREFECT_HOME"] = str(_STATE / "prefect")
os.environ["XDG_CONFIG_HOME"] = str(_STATE / "xdg")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
