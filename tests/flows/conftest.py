from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prefect_server():
    """One temporary Prefect server for every flow test of the session (5-16 s to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
