"""Where the node store's shards live and how one is written: declared table schemas,
deterministic paths, atomic writes.

Layout under a home directory ``DIR`` (hive partitions named like the columns, so DuckDB's
views read ``run_id`` / ``iteration`` from the path and skip the files a filter excludes)::

    DIR/shards/{table}/_schema.parquet                                   empty, declares the columns
    DIR/shards/{table}/run_id={run_id}/iteration={iteration:05d}/{stage}.parquet
    DIR/shards/runs/run_id={run_id}/{stage}.parquet                      the one table without an iteration

A file is written to a temporary name in its own directory, fsynced, then ``os.replace``d onto
its final name, so a reader sees either the whole shard or none of it, and re-running a stage
replaces its shard instead of adding duplicate rows. Both the shard writer
(``trace_core.home.shards``) and the migration of older homes (``trace_core.home.migrate``)
build on this module.
"""

from __future__ import annotations

import os
import re
import uuid
from itertools import takewhile
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from trace_core.nodes import NODE_SCHEMA

PROMPT_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "iteration": pl.Int32,
    "prompt_id": pl.Utf8,
    "task": pl.Utf8,  # task family: math | qa | fc
    "difficulty": pl.Int32,
    "v_pred": pl.Float32,  # predicted success probability before sampling
    "m_alloc": pl.Int32,  # rollouts allocated (0 = skipped)
    "utility": pl.Float32,  # V_root(v_pred, m_alloc); its posterior expectation with root_posterior
    "v_concentration": pl.Float32,  # pseudo-trajectories behind v_pred (prior strength + own record; null: none)
    "ref_score": pl.Float32,  # the demonstration's within-cell log-prob rank in [-0.5, 0.5] (null: not scored)
    "is_shift": pl.Float32,  # the record's importance-weighted minus plain rate, in logits (null: not scored)
    "v_unshifted": pl.Float32,  # v_pred before the history shift moved it (= v_pred with the shift off)
    "n_success": pl.Int32,  # raw rollouts that succeeded (null when skipped)
    "n_total": pl.Int32,  # raw rollouts generated
    "policy_version": pl.Int32,  # the weights whose rollouts this allocation bought
    "outcome_version": pl.Int32,  # the newest policy version of the outcomes v_pred was fitted on (null: none)
}

ITERATION_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "iteration": pl.Int32,
    "budget_asked": pl.Int64,  # trajectories the strategy was allowed
    "budget_used": pl.Int64,  # trajectories actually generated
    "tokens": pl.Int64,  # generated tokens
    "effective_ratio": pl.Float64,
    "wasted_share": pl.Float64,
    "accuracy": pl.Float64,  # held-out accuracy over all families
    "accuracy_math": pl.Float64,
    "accuracy_qa": pl.Float64,
    "accuracy_fc": pl.Float64,
    "loss": pl.Float64,
    "timings": pl.Utf8,  # JSON object: stage name -> seconds
    "created_at": pl.Datetime("us"),
}

PREDICTION_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "iteration": pl.Int32,
    "node_id": pl.Utf8,  # the prompt's root node or the prefix node
    "prompt_id": pl.Utf8,
    "task": pl.Utf8,
    "kind": pl.Utf8,  # 'root' | 'prefix'
    "v_pred": pl.Float32,  # made before the outcome was seen (prospective)
    "outcome": pl.Float32,  # observed success rate under the node, in [0, 1]
    "weight": pl.Float32,  # number of outcomes behind ``outcome``
    "policy_version": pl.Int32,  # the weights whose outcome this prediction was scored on
    "outcome_version": pl.Int32,  # the newest policy version of the outcomes the predictor was fitted on
}

RUN_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "parent_run_id": pl.Utf8,  # the compare run this run belongs to, if any
    "config_hash": pl.Utf8,
    "config_json": pl.Utf8,
    "seed": pl.Int64,
    "status": pl.Utf8,  # 'running' | 'finished' | 'failed'
    "started_at": pl.Datetime("us"),
    "finished_at": pl.Datetime("us"),  # null while running
    "git_commit": pl.Utf8,  # HEAD of the checkout the run's code came from; null outside a git checkout
}

EVALUATION_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "iteration": pl.Int32,  # iterations trained before this evaluation (0 = the warm start)
    "split": pl.Utf8,  # 'heldout' | 'probe' (a fixed sample of training prompts)
    "family": pl.Utf8,  # 'all' or a task family
    "accuracy": pl.Float64,  # mean sampled reward
    "episodes": pl.Int64,
    "seconds": pl.Float64,
    "created_at": pl.Datetime("us"),
}

# One row per sampling group, written once per iteration beside its nodes (``trace_core.home.groups``)
# and read by the named wasted-rollout queries, so they scan groups (~1 a 10 nodes) instead of nodes.
GROUP_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "iteration": pl.Int32,
    "prompt_id": pl.Utf8,
    "task": pl.Utf8,
    "difficulty": pl.Int32,
    "origin": pl.Utf8,  # 'raw' (the rollouts of a prompt) | 'extension' (the continuations from a prefix)
    "anchor_id": pl.Utf8,  # the prefix node an extension group branches from; null for a raw group (the root)
    "anchor_depth": pl.Int32,  # 0 for a raw group, t for continuations from the prefix after turn t
    "trajectories": pl.Int64,  # the group's own generated trajectories (an owner counts in its raw group)
    "tokens": pl.Int64,  # their generated tokens
    "successes": pl.Float64,  # sum of their rewards
    "contrastive": pl.Boolean,  # the group (owner included) holds different rewards
    "effective": pl.Int64,  # own trajectories that are effective (see the trajectories view)
    "effective_tokens": pl.Int64,
    "owner_trajectory_id": pl.Utf8,  # extension group: the raw trajectory through the anchor
    "owner_reward": pl.Float64,
    "group_size": pl.Int64,  # the whole group, owner included
    "group_successes": pl.Float64,
    "flips": pl.Int64,  # extension group: continuations whose reward differs from the owner's
}

# One row per prompt per iteration: its groups summed, written beside the group summary. The one
# question that groups by prompt (top_wasted_prompts: millions of distinct prompts in a long run
# over a fresh prompt stream) reads half the rows of the group summaries, and narrower ones.
PROMPT_GROUP_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Utf8,
    "strategy": pl.Utf8,
    "iteration": pl.Int32,
    "prompt_id": pl.Utf8,
    "task": pl.Utf8,
    "difficulty": pl.Int32,
    "raw_groups": pl.Int64,  # the prompt's raw groups in the iteration (1 when it was sampled)
    "groups": pl.Int64,  # raw and extension groups
    "trajectories": pl.Int64,  # sums of the trajectory_groups columns of the same name
    "tokens": pl.Int64,
    "successes": pl.Float64,
    "effective": pl.Int64,
    "effective_tokens": pl.Int64,
    "wasted": pl.Int64,  # trajectories - effective
}

#: tables written once per run, not per iteration (their shards sit directly under ``run_id=R/``)
RUN_TABLES = frozenset({"runs"})

TABLES: dict[str, dict[str, pl.DataType]] = {
    "nodes": NODE_SCHEMA,
    "prompts": PROMPT_SCHEMA,
    "iterations": ITERATION_SCHEMA,
    "evaluations": EVALUATION_SCHEMA,
    "predictions": PREDICTION_SCHEMA,
    "runs": RUN_SCHEMA,
    "trajectory_groups": GROUP_SCHEMA,
    "prompt_groups": PROMPT_GROUP_SCHEMA,
}

#: row order within a shard, for tables whose rows are free to reorder: with row-group statistics,
#: a filter on the leading columns skips row groups (node shards keep the order the stages wrote:
#: the update reads them back in that order).
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "trajectory_groups": ("task", "anchor_depth", "difficulty", "prompt_id", "anchor_id"),
}
#: rows per row group of a sorted table's shards: small enough that a task or depth filter skips
#: most of an iteration's row groups (~1 task, 1-2 depths each), large enough to scan at full speed
ROW_GROUP_ROWS: dict[str, int] = {"trajectory_groups": 1024}

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
SCHEMA_SHARD = "_schema.parquet"
# zstd level 1: ~as fast as lz4/snappy with polars, smaller files (measured in bench_store.py)
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1
# row-group statistics (min / max): the catalogue file reads shards without hive partitioning, so a
# filter on run_id / iteration (or, in sorted group shards, task / depth) skips row groups by them;
# bench_store.py checks the skipping with EXPLAIN
STATISTICS = True
# Node shards, the bulk of a home: dictionaries only on the repeated text columns (ids and model text
# are mostly unique, so a dictionary is built, then abandoned) and min / max statistics only on
# run_id and iteration, what the catalogue skips row groups by (the other columns' skip nothing: a
# shard is one iteration's nodes in the stages' order, one row group). Written by pyarrow, which
# takes both per column: ~13% less CPU and ~25% smaller files than polars' writer with every
# column's statistics (100k benchmark nodes: 64 vs 74 ms CPU, 837 vs 1,105 KiB)
NODE_WRITE = {"dictionary": ("run_id", "strategy", "task", "origin", "reward_reason"),
              "statistics": ("run_id", "iteration")}


class CorruptShard(ValueError):
    """A Parquet shard that does not open (truncated, overwritten); names the file."""

    def __init__(self, path: str | Path, reason: str):
        self.path, self.reason = Path(path), " ".join(reason.split())
        super().__init__(f"corrupt shard {self.path}: {self.reason}")


GLOB_CHARS = frozenset("*?[]{}")  # DuckDB expands these in read_parquet paths; no escape exists


def check_home_path(home_dir: str | Path) -> Path:
    """``home_dir`` resolved, if it can sit inside the views' ``read_parquet`` globs as a literal;
    ``ValueError`` when it holds glob characters (the views would read other homes' shards)."""
    home = Path(home_dir).resolve()
    bad = sorted(set(str(home)) & GLOB_CHARS)
    if bad:
        raise ValueError(f"home {str(home)!r} holds glob characters {''.join(bad)!r}: the store's views would "
                         "read other directories' shards; choose a home path without them")
    return home


def check_name(kind: str, value: str) -> str:
    if not _SAFE.match(value):
        raise ValueError(f"{kind} {value!r} must match {_SAFE.pattern} (it becomes a path component)")
    return value


def table_schema(table: str) -> dict[str, pl.DataType]:
    if table not in TABLES:
        raise KeyError(f"unknown table {table!r}; known tables: {sorted(TABLES)}")
    return TABLES[table]


def table_dir(home_dir: str | Path, table: str) -> Path:
    table_schema(table)
    return Path(home_dir) / "shards" / table


def shard_relpath(table: str, run_id: str, stage: str, iteration: int | None = None) -> str:
    """Deterministic shard path under the home: the same (table, run, iteration, stage) always maps
    here. Every table but ``runs`` is partitioned by iteration too (one layout per table's view)."""
    table_schema(table)
    base = f"shards/{table}/run_id={check_name('run_id', run_id)}"
    if (iteration is None) != (table in RUN_TABLES):
        raise ValueError(f"table {table!r} shards {'take no' if table in RUN_TABLES else 'need an'} iteration")
    if iteration is not None:
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        base += f"/iteration={iteration:05d}"
    return f"{base}/{check_name('stage', stage)}.parquet"


def shard_path(home_dir: str | Path, table: str, run_id: str, stage: str, iteration: int | None = None) -> Path:
    """``shard_relpath`` under a local home."""
    return Path(home_dir) / shard_relpath(table, run_id, stage, iteration)


def shard_url(home: str, table: str, run_id: str, stage: str, iteration: int | None = None) -> str:
    """``shard_relpath`` under an object-storage home (``s3://bucket/prefix``)."""
    return f"{home.rstrip('/')}/{shard_relpath(table, run_id, stage, iteration)}"


def write_parquet_atomic(frame: pl.DataFrame, path: Path, row_group_size: int | None = None, *,
                         dictionary: tuple[str, ...] | None = None, statistics: tuple[str, ...] | None = None) -> Path:
    """Write ``frame`` to ``path`` so that readers see the old file, or the whole new one.
    ``dictionary`` / ``statistics``: the only columns dictionary-encoded / given min-max statistics
    (``NODE_WRITE``; default: polars' writer, dictionaries where they pay, statistics everywhere).

    Temporary file in the same directory (``os.replace`` is atomic only within a filesystem),
    named ``*.tmp`` so the views' ``*.parquet`` glob never matches a half-written shard, created
    with mode 0666 less the umask (0644 usually: other users can query; ``mkstemp`` gives 0600).
    """
    created = list(takewhile(lambda d: not d.is_dir(), (path.parent, *path.parent.parents)))  # parents to sync
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            if dictionary is None and statistics is None:
                frame.write_parquet(fh, compression=COMPRESSION, compression_level=COMPRESSION_LEVEL,
                                   statistics=STATISTICS, row_group_size=row_group_size)
            else:
                pq.write_table(frame.to_arrow(), fh, row_group_size=row_group_size, compression=COMPRESSION,
                               compression_level=COMPRESSION_LEVEL, use_dictionary=list(dictionary or ()),
                               write_statistics=list(statistics or ()))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for d in (path.parent, *[c.parent for c in created]):  # the rename and new directories survive a power cut
        fsync_dir(d)
    return path


def fsync_dir(directory: Path) -> None:
    """Flush a directory's entries (a rename or a new file in it) to disk; best effort."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def table_glob(table: str) -> str:
    """The data shards of ``table`` relative to the home, as the views' ``read_parquet`` reads them."""
    table_schema(table)
    return f"shards/{table}/run_id=*/" + ("" if table in RUN_TABLES else "iteration=*/") + "*.parquet"


def table_shards(home_dir: str | Path, table: str) -> list[Path]:
    """Every shard file behind ``table``'s view (what its ``**/*.parquet`` glob reads), sorted."""
    return sorted(table_dir(home_dir, table).rglob("*.parquet"))
