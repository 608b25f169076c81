"""One empty MLflow SQLite store, migrated once per session and copied where a test needs a fresh
database (the migration takes seconds on a busy 2-core box; the tests check what is logged into it,
not its creation, which tests/tracking/test_tracking_faults.py covers)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def template_db(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store at the current schema."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path

