"""SIGTERM / SIGINT during ``trace-rl train``, with real processes: the run
stops within seconds with one line and exit 128 + signal, and leaves no process behind (the
temporary Prefect server included); after kill -9 the temporary server does not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,  # each test starts `train` with a temporary Prefect server (30-80 s)
    pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(), reason="shipped tiny checkpoint missing"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (by /proc parent links)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parent.items() if pp == p}
        out |= kids
        todo.extend(kids)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_train(tmp_path: Path) -> tuple[subprocess.Popen, list[str], set[int]]:
    """``trace-rl train`` in a session of its own, once its first iteration runs; its descendants."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),  # the conftest's home is for in-process runs
           "PYTHONUNBUFFERED": "1"}  # the "iter 0" line as soon as it is logged
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs" / "small-ci.yaml"),
         "--home", str(tmp_path / "home"), "--run-id", "s", "--set", "run.iterations=1000", "--set", "run.threads=1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    t0 = time.monotonic()
    first = tmp_path / "home" / "runs" / "s" / "checkpoints" / "iter=00000"  # iteration 0 done
    try:
        while time.monotonic() - t0 < 120 and proc.poll() is None and not first.is_dir():
            time.sleep(0.2)
        assert proc.poll() is None, "".join(lines[-20:])
        assert first.is_dir(), "no iteration finished in 120 s: " + "".join(lines[-20:])
        started = _children(proc.pid)
        assert started, "no temporary server child"
    except BaseException:
        for p in _children(proc.pid):
            os.kill(p, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc, lines, started


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_stops_train_cleanly(tmp_path, sig):
    proc, lines, started = _start_train(tmp_path)
    try:
        os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C or a job scheduler does: the whole group
        t1 = time.monotonic()
        rc = proc.wait(timeout=30)
        assert time.monotonic() - t1 < 20
        assert rc == 128 + sig, "".join(lines[-30:])
        time.sleep(1)
        text = "".join(lines)
        assert f"interrupted by {sig.name}" in text and "Traceback" not in text, text[-3000:]
        assert not [p for p in started if _alive(p)], "left running"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sigkill_leaves_no_server_behind(tmp_path):
    """kill -9 of ``train`` alone (no handler runs): the temporary server, in a session of its own,
    is ended by the kernel (parent-death signal) with every process it started."""
    proc, _, started = _start_train(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=10)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and [p for p in started if _alive(p)]:
            time.sleep(0.5)
        assert not [p for p in started if _alive(p)], "temporary server orphaned after kill -9"
    finally:
        for p in started:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
