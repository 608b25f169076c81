"""Process lifecycle of ``trace-rl train``: a temporary Prefect server owned by this process and
a clean stop on SIGTERM / SIGINT.

The server runs in its own session (a Ctrl-C or a signal to the job's process group does not
reach it, so the run can still report its final state) and gets SIGTERM from the kernel when
this process dies, even by kill -9 (``PR_SET_PDEATHSIG``, Linux). A signal to ``train`` raises
``Interrupted`` in the main thread: the flow is marked crashed, the server is stopped, and the
command exits 128 + signal number with one line.

Servers that share a Prefect home (the default ``~/.prefect``) start one at a time: the first
start of a fresh home creates and migrates its database, and two migrations at once fail (the
loser exits with code 3). A file lock in the home (``server-start.lock``) is held from a server's
start until it answers; the next one then finds the database migrated.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived (``signum``)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into ``Interrupted`` in the main thread while the block runs."""
    def handler(signum, _frame):
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextmanager
def start_lock(home: Path) -> Iterator[None]:
    """Held while a server of the Prefect home ``home`` starts (an exclusive ``flock``, released
    when the process dies, even by kill -9: a crashed starter never blocks the next)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "server-start.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def temporary_server() -> Iterator[None]:
    """A local Prefect API for the block (unless ``PREFECT_API_URL`` names one), stopped at exit."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    if PREFECT_API_URL.value():
        yield
        return
    with start_lock(Path(PREFECT_HOME.value())):  # one migration at a time
        proc, url = _start_server()
    with temporary_settings({PREFECT_API_URL: url}):
        yield


def _start_server() -> tuple[subprocess.Popen, str]:
    """Start a local Prefect API on a free port; return it with its URL once it answers."""
    import httpx
    import prefect
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
         "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "error", "--lifespan", "on"],
        env=env, start_new_session=True, preexec_fn=_die_with_parent)
    # stopped at interpreter exit, after Prefect's log and event workers (registered later, so run
    # earlier) have flushed to it; PR_SET_PDEATHSIG covers a process that dies without exiting
    atexit.register(_stop, proc)
    try:
        url = f"http://127.0.0.1:{port}/api"
        wait = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
        deadline = time.monotonic() + wait
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the temporary Prefect server exited with code {proc.returncode}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the temporary Prefect server did not answer within {wait:.0f} s (a loaded machine "
                                   "starts it slower: PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120 waits longer)")
            time.sleep(0.1)
    except BaseException:
        _stop(proc)
        raise
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
