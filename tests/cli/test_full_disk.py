"""A full disk during ``trace-rl train``, on a real small tmpfs: one line and
exit 2 instead of hundreds of lines of traceback, and a resume once space is freed finishes the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.cli.test_signals_commands import SMALL, _start
from trace_core.policy.model import TINY_WARM_DIR

pytestmark = [pytest.mark.slow,  # two `train` runs, each with its own temporary Prefect server (~1-4 min)
              pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(), reason="shipped tiny checkpoint missing")]


@pytest.mark.parametrize("size", ["3m"])
def test_full_disk_is_one_line_and_resumes(tmp_path, size):
    if os.geteuid() != 0 or shutil.which("mount") is None or not sys.platform.startswith("linux"):
        pytest.skip("needs root to mount a small tmpfs")
    home = tmp_path / "disk"
    home.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(home)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        args = ["train", "--config", SMALL, "--home", str(home), "--run-id", "f", "--set", "run.iterations=1", "--set", "run.threads=1"]
        proc, lines = _start(tmp_path, args)
        rc = proc.wait(timeout=300)
        text = "".join(lines)
        assert rc == 2, text[-3000:]
        out = [line for line in text.splitlines() if line.strip()]
        # the command's own end is one line; Prefect's log above it names the failed task (with
        # the flow run's traceback, once), where a full disk printed 373 to 617 lines before
        assert out[-1].startswith("disk full") and "--run-id" in out[-1], text[-2000:]
        assert sum(line.startswith("disk full") for line in out) == 1 and text.count("Traceback") <= 1
        assert len(out) < 150, len(out)
        subprocess.run(["mount", "-o", "remount,size=256m", str(home)], check=True)  # space freed
        proc, lines = _start(tmp_path, args)
        assert proc.wait(timeout=300) == 0, "".join(lines)[-3000:]
        assert (home / "runs" / "f" / "checkpoints").is_dir()
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)
