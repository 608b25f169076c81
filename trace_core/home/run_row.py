"""The ``runs`` table: one row per run, rewritten (atomically) when the run starts and ends.

``recording_run`` wraps a training run: status ``running`` on entry, ``finished`` on a normal
exit, ``failed`` when anything escapes (the exception goes on). A resumed run keeps the
``started_at`` of its first start. The row lives in its own shard,
``DIR/shards/runs/run_id=R/run.parquet``, read by the ``runs`` view.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
from pydantic import BaseModel

from trace_core.config.io import config_hash
from trace_core.home.shards import ShardWriter, read_shard
from trace_core.nodes import utc_now

STAGE = "run"
STATUSES = ("running", "finished", "failed")
_CODE_DIR = Path(__file__).resolve().parents[1]  # trace_core/: the code a run came from


def git(*args: str, directory: str | Path = _CODE_DIR) -> subprocess.CompletedProcess | None:
    """``git -C directory ARGS``, bounded in time; None without git (or on a hung file system)."""
    try:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit(directory: str | Path = _CODE_DIR) -> str | None:
    """HEAD of the git checkout holding ``directory`` (the run's code), or None outside one
    (or without git); bounded in time."""
    out = git("rev-parse", "--verify", "HEAD", directory=directory)
    sha = out.stdout.strip() if out is not None else ""
    return sha if out is not None and out.returncode == 0 and len(sha) in (40, 64) else None


def write_run_row(home_dir: str | Path, run_id: str, cfg: BaseModel, status: str, *, strategy: str | None = None,
                  seed: int | None = None, parent_run_id: str | None = None) -> Path:
    """Write (or rewrite) the run's row with ``status``; returns the shard path. ``parent_run_id``:
    the comparison the run is a child of (``trace-rl compare``), so its children select as one."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    writer = ShardWriter(home_dir, run_id)
    path = writer.path("runs", stage=STAGE)
    started = None
    if path.is_file():  # a resumed run: keep its first start
        started = read_shard(path)["started_at"][0]
    now = utc_now()
    row = {
        "run_id": run_id, "strategy": strategy, "parent_run_id": parent_run_id, "config_hash": config_hash(cfg),
        "config_json": cfg.model_dump_json(), "seed": seed, "status": status,
        "started_at": started or now, "finished_at": None if status == "running" else now,
        "git_commit": git_commit(),
    }
    return writer.write("runs", pl.DataFrame([row]), stage=STAGE)


@contextmanager
def recording_run(home_dir: str | Path, run_id: str, cfg: BaseModel, *, strategy: str | None = None,
                  seed: int | None = None, parent_run_id: str | None = None) -> Iterator[None]:
    """``running`` now; ``finished`` or ``failed`` (and re-raise) when the block ends."""
    kw = {"strategy": strategy, "seed": seed, "parent_run_id": parent_run_id}
    write_run_row(home_dir, run_id, cfg, "running", **kw)
    try:
        yield
    except BaseException:
        write_run_row(home_dir, run_id, cfg, "failed", **kw)
        raise
    write_run_row(home_dir, run_id, cfg, "finished", **kw)
