"""Homes written in the older shard layout, moved into the current one when the store opens.

Old: ``shards/{table}/run={R}/iter={N}/{stage}.parquet``. Current: ``run_id={R}/iteration={N}/``
(hive keys that are the column names, so DuckDB prunes files on them). Each ``iter=N``
directory is renamed whole into ``run_id=R/iteration=N`` (one atomic rename: a reader sees the
iteration's shards at the old place or at the new one, never half of them), then the emptied
``run=R`` is removed. A migration cut short resumes at the next open. Node shards written before
the anchor columns existed get them first (``nodes.with_anchors`` over the iteration's shards
together, rewritten atomically), so the views' one-pass group queries see every trajectory.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import polars as pl

from trace_core.home.layout import TABLES, fsync_dir, table_dir, write_parquet_atomic
from trace_core.nodes import with_anchors

log = logging.getLogger(__name__)

OLD_RUN, OLD_ITER = "run=", "iter="
NEW_RUN, NEW_ITER = "run_id=", "iteration="


class LayoutConflict(RuntimeError):
    """An old-layout directory whose target in the current layout already exists."""


def old_run_dirs(home_dir: str | Path) -> list[Path]:
    """The ``run=R`` directories still in the old layout, over every table."""
    out = []
    for table in TABLES:
        tdir = table_dir(home_dir, table)
        if tdir.is_dir():
            out += sorted(p for p in tdir.iterdir() if p.name.startswith(OLD_RUN) and p.is_dir())
    return out


def _backfill_anchors(iter_dir: Path) -> int:
    """Rewrite the node shards of one iteration directory that lack the anchor columns."""
    files = sorted(iter_dir.glob("*.parquet"))
    stale = [f for f in files if "anchor_id" not in pl.read_parquet_schema(f)]
    if not stale:
        return 0
    frames = [pl.read_parquet(f).with_columns(pl.lit(k).alias("_shard")) for k, f in enumerate(files)]
    whole = with_anchors(pl.concat(frames, how="diagonal_relaxed"))
    for k, f in enumerate(files):
        if f in stale:
            part = whole.filter(pl.col("_shard") == k).drop("_shard")
            write_parquet_atomic(part.select([c for c in TABLES["nodes"] if c in part.columns]), f)
    return len(stale)


def _move(src: Path, dst: Path) -> None:
    if dst.exists():
        raise LayoutConflict(f"cannot migrate {src}: {dst} already exists (two copies of one shard); "
                             f"keep one of them and open the home again")
    os.rename(src, dst)  # atomic within the filesystem; a directory moves with all its shards


def migrate_layout(home_dir: str | Path) -> int:
    """Move every old-layout shard of ``home_dir`` into the current layout; returns the number of
    iteration directories and run-level shards moved (0 for a current home)."""
    moved = 0
    for old in old_run_dirs(home_dir):
        new = old.with_name(NEW_RUN + old.name.removeprefix(OLD_RUN))
        new.mkdir(exist_ok=True)
        for entry in sorted(old.iterdir()):
            if entry.is_dir() and entry.name.startswith(OLD_ITER):
                if old.parent.name == "nodes":
                    _backfill_anchors(entry)
                _move(entry, new / (NEW_ITER + entry.name.removeprefix(OLD_ITER)))
            elif entry.is_file() and entry.suffix == ".parquet":
                _move(entry, new / entry.name)
            elif entry.is_file() and entry.suffix == ".tmp":  # a write that never finished
                entry.unlink()
                continue
            else:
                raise LayoutConflict(f"cannot migrate {old}: unexpected entry {entry.name!r}; move it out of "
                                     f"the shards directory and open the home again")
            moved += 1
        fsync_dir(new)
        old.rmdir()
        fsync_dir(old.parent)
        log.warning("migrated %s to the run_id=/iteration= layout (%s)", old, new)
    return moved
