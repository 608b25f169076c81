"""SIGTERM / SIGINT to every long command, with real processes and a signal to
the whole process group, as a terminal or a scheduler sends it: the command ends within 20 s with
one line and exit 128 + signal, and leaves no process behind (Prefect server, Ray included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli.test_signals_train import _alive, _children
from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
SMALL = str(ROOT / "configs" / "small-ci.yaml")
pytestmark = [
    pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(), reason="shipped tiny checkpoint missing"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]


def _start(tmp_path: Path, args: list[str]) -> tuple[subprocess.Popen, list[str]]:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def _wait(proc: subprocess.Popen, lines: list[str], ready, timeout: float = 180) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None and not ready():
        time.sleep(0.2)
    assert proc.poll() is None and ready(), "".join(lines[-30:])


def _stop_and_check(proc: subprocess.Popen, lines: list[str], sig: int) -> float:
    """Signal the group; assert the clean end; the seconds it took."""
    seen: set[int] = set()
    try:
        seen = _children(proc.pid)
        os.killpg(proc.pid, sig)
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 60:
            seen |= _children(proc.pid)  # servers or Ray processes started meanwhile
            time.sleep(0.1)
        took = time.monotonic() - t0
        rc = proc.wait(timeout=5)
        time.sleep(1.5)
        text = "".join(lines)
        assert rc == 128 + sig, (rc, text[-3000:])
        assert took < 20, took
        assert f"interrupted by {signal.Signals(sig).name}" in text and "Traceback" not in text, text[-3000:]
        left = [p for p in seen if _alive(p)]
        print(f"\n{proc.args[3]} {signal.Signals(sig).name}: exit {rc} after {took:.1f} s, "
              f"{len(seen)} descendants seen, {len(left)} left")
        assert not left, f"left running: {left}"
        return took
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in seen:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_sigterm_in_the_first_second_of_train(tmp_path):
    proc, lines = _start(tmp_path, ["train", "--config", SMALL, "--home", str(tmp_path / "h"), "--run-id", "s"])
    time.sleep(1.0)  # imports still running
    _stop_and_check(proc, lines, signal.SIGTERM)


@pytest.mark.slow
def test_sigterm_stops_compare(tmp_path):  # SIGINT takes the same path (tests/cli/test_signals_train.py for train)
    home = tmp_path / "h"
    proc, lines = _start(tmp_path, ["compare", "--config", SMALL, "--home", str(home), "--run-id", "c",
                                    "--strategies", "grpo,trace", "--seeds", "1", "--set", "run.iterations=50",
                                    "--set", "run.threads=1"])
    _wait(proc, lines, lambda: (home / "runs" / "c-grpo-s0" / "checkpoints" / "iter=00000").is_dir())
    _stop_and_check(proc, lines, signal.SIGTERM)


@pytest.mark.xfail(strict=False, reason="known intermittent defect: in 2 of the last 3 full-suite runs (once at "
                   "load ~1) the warmup did not exit within 65 s of SIGTERM; it passes alone. Not yet found")
@pytest.mark.slow
def test_sigterm_stops_warmup(tmp_path):
    proc, lines = _start(tmp_path, ["warmup", "--config", SMALL, "--out", str(tmp_path / "w"),
                                    "--set", "warmup.steps=100000"])
    time.sleep(8)  # building the tokenizer or in SFT steps
    _stop_and_check(proc, lines, signal.SIGTERM)
    assert not (tmp_path / "w" / "config.json").exists()


@pytest.mark.ray
@pytest.mark.slow
def test_sigterm_stops_train_on_a_ray_pool(tmp_path):
    pytest.importorskip("ray")
    home = tmp_path / "h"
    proc, lines = _start(tmp_path, ["train", "--config", SMALL, "--home", str(home), "--run-id", "s",
                                    "--set", "run.iterations=1000", "--set", "run.rollout_workers=1",
                                    "--set", "run.threads=1"])
    _wait(proc, lines, lambda: (home / "runs" / "s" / "checkpoints" / "iter=00000").is_dir(), timeout=300)
    _stop_and_check(proc, lines, signal.SIGTERM)
