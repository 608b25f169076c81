"""Parquet shards of the node store: rows conformed to their table, written, read, checked.

Paths, table schemas and the atomic file write are ``trace_core.home.layout``. Homes written in
the older ``run=R/iter=N`` layout are moved into the current one when opened
(``trace_core.home.migrate``). This module does not import duckdb; the DuckDB catalogue over
these files lives in ``trace_core.store``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import polars as pl

from trace_core.home import objstore
from trace_core.home.groups import (
    NODE_COLUMNS,
    SUMMARY_STAGE,
    backfill_groups,
    group_rows,
    prompt_rows,
    summarise_partition,
)
from trace_core.home.layout import (
    COMPRESSION,
    COMPRESSION_LEVEL,
    NODE_WRITE,
    ROW_GROUP_ROWS,
    SCHEMA_SHARD,
    STATISTICS,
    TABLES,
    CorruptShard,
    check_name,
    shard_path,
    shard_url,
    table_dir,
    table_schema,
    table_shards,
    write_parquet_atomic,
)
from trace_core.home.migrate import migrate_layout
from trace_core.nodes import with_anchors

log = logging.getLogger(__name__)


def conform(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    """``frame`` with exactly the table's columns, order and dtypes (missing columns -> null).

    Unknown columns are an error: they would silently vanish from the views otherwise.
    """
    schema = table_schema(table)
    extra = [c for c in frame.columns if c not in schema]
    if extra:
        raise ValueError(f"table {table!r} has no columns {extra}; its columns are {list(schema)}")
    cols = [
        pl.col(c).cast(dt, strict=True) if c in frame.columns else pl.lit(None, dtype=dt).alias(c)
        for c, dt in schema.items()
    ]
    return frame.select(cols)


def ensure_schema_shards(home_dir: str | Path, skip: Collection[Path] = (), *,
                         summaries: bool = True) -> dict[Path, str]:
    """An empty shard per table, so the views bind (with the declared columns) before any data;
    rewritten when the declared columns changed. A home in the older layout is moved first. With
    ``summaries``, node partitions without a current group summary (written before the summaries,
    or changed since) get one, but those holding a shard of ``skip`` (unreadable ones); returns
    the partitions left without one (``backfill_groups``: an unreadable node shard, or a home not
    writable), whose groups must be read from the nodes."""
    if objstore.is_remote(home_dir):  # object storage homes never had the old layout
        for table, schema in TABLES.items():
            if not objstore.exists(url := f"{str(home_dir).rstrip('/')}/shards/{table}/{SCHEMA_SHARD}"):
                objstore.put_parquet(pl.DataFrame(schema=schema), url)
        return {}
    migrate_layout(home_dir)
    for table, schema in TABLES.items():
        path = table_dir(home_dir, table) / SCHEMA_SHARD
        if not path.exists() or _schema_of(path) != schema:
            upgrade_shards(home_dir, table)  # first: a crash in between redoes it at the next open
            write_parquet_atomic(pl.DataFrame(schema=schema), path)
    return backfill_groups(home_dir, skip) if summaries else {}


def upgrade_shards(home_dir: str | Path, table: str) -> int:
    """Rewrite ``table``'s data shards that lack some of its declared columns (written before
    they were declared) with exactly the declared columns, the new ones null: the views read
    every shard by the first one's columns. Runs when the table's schema shard is missing or
    stale, so once per change of the columns. A shard holding columns beyond the declared ones
    (a newer writer's) or one that does not open is left as it is. Returns the shards rewritten."""
    schema, done = table_schema(table), 0
    for path in table_shards(home_dir, table):
        if path.name == SCHEMA_SHARD or (have := _schema_of(path)) is None or have == schema:
            continue
        if set(have) - set(schema):
            log.warning("shard %s holds columns %s this version does not declare: left as it is", path,
                        sorted(set(have) - set(schema)))
            continue
        write_parquet_atomic(conform(pl.read_parquet(path), table), path)
        done += 1
    if done:
        log.warning("upgraded %d %s shards of %s to the declared columns", done, table, home_dir)
    return done


def _schema_of(path: Path) -> dict | None:
    try:
        return dict(pl.read_parquet_schema(path))
    except (pl.exceptions.PolarsError, OSError):
        return None  # unreadable: rewritten (it holds no rows)


def write_shard(
    home_dir: str | Path,
    table: str,
    frame: pl.DataFrame,
    *,
    run_id: str,
    stage: str,
    iteration: int | None = None,
    schema_checked: bool = False,
) -> Path:
    """Conform ``frame`` to ``table`` and write it as the shard of (run, iteration, stage).

    Rows whose ``run_id`` differs from ``run_id`` are rejected (they would land in another run's
    partition). A node shard's partition gets its group summary rewritten (``trace_core.home.groups``):
    the iteration's groups are known once its nodes are. Returns the shard path (a small,
    serialisable reference for Prefect tasks). ``schema_checked``: the home's schema shards were
    checked when the caller opened it (``ShardWriter``), so they are not checked again per write.
    """
    remote = objstore.is_remote(home_dir)
    path = (shard_url if remote else shard_path)(home_dir, table, run_id, stage, iteration)
    if table == "nodes" and _lacks_anchors(frame):
        frame = with_anchors(frame)
    out = conform(frame, table)
    # the partition path states run_id / iteration: a row saying otherwise would be misread
    if out.select((pl.col("run_id") != run_id).any()).item():
        raise ValueError(f"{table} rows with run_id other than {run_id!r} in shard {stage!r}")
    if iteration is not None and out.select((pl.col("iteration") != iteration).any()).item():
        raise ValueError(f"{table} rows with iteration other than {iteration} in shard {stage!r}")
    # the columns only: the rest of the home was summarised when it was opened (ShardWriter, a query),
    # and this partition is summarised below (scanning every partition per write grew with the run)
    if not schema_checked:
        ensure_schema_shards(home_dir, summaries=False)
    if remote:  # one PUT: the object is whole or absent
        objstore.put_parquet(out, path, compression=COMPRESSION, compression_level=COMPRESSION_LEVEL,
                             statistics=STATISTICS)
        if table == "nodes":
            _summarise_remote(home_dir, out, path, run_id, iteration)
        return path
    write_parquet_atomic(out, path, **(NODE_WRITE if table == "nodes" else {}))
    if table == "nodes":
        summarise_partition(home_dir, path.parent, frame=out, written=path)
    return path


def _summarise_remote(home: str, frame: pl.DataFrame, written: str, run_id: str, iteration: int) -> None:
    """The group and prompt summaries of an object-storage node partition: ``frame`` and its other shards."""
    others = [objstore.read_parquet(u) for u in objstore.list_parquet(written.rsplit("/", 1)[0]) if u != written]
    whole = pl.concat([f.select([c for c in NODE_COLUMNS if c in f.columns]) for f in [frame, *others]],
                      how="diagonal_relaxed")
    groups = group_rows(whole)
    objstore.put_parquet(prompt_rows(groups), shard_url(home, "prompt_groups", run_id, SUMMARY_STAGE, iteration),
                         compression=COMPRESSION, compression_level=COMPRESSION_LEVEL, statistics=STATISTICS)
    objstore.put_parquet(groups, shard_url(home, "trajectory_groups", run_id, SUMMARY_STAGE, iteration),
                         compression=COMPRESSION, compression_level=COMPRESSION_LEVEL, statistics=STATISTICS,
                         row_group_size=ROW_GROUP_ROWS["trajectory_groups"])


def _lacks_anchors(frame: pl.DataFrame) -> bool:
    """True when some non-root node has no ``anchor_id`` (a frame built without ``finalize_tree``)."""
    if "anchor_id" not in frame.columns:
        return "depth" in frame.columns and "trajectory_id" in frame.columns
    return frame.select((pl.col("anchor_id").is_null() & (pl.col("depth") > 0)).any()).item()


def shard_error(path: str | Path, *, deep: bool = False) -> str | None:
    """Why the shard at ``path`` cannot be read, or None: its footer and schema (cheap), and
    with ``deep`` every row group too (a file damaged in the middle keeps a valid footer)."""
    try:
        pl.read_parquet(path) if deep else pl.read_parquet_schema(path)
    except FileNotFoundError:
        return "missing"
    except (pl.exceptions.PolarsError, OSError) as err:
        return " ".join(str(err).split()) or type(err).__name__
    return None


def read_shard(path: str | Path) -> pl.DataFrame:
    """The shard at ``path``; ``FileNotFoundError`` or ``CorruptShard`` naming it otherwise."""
    try:
        return pl.read_parquet(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"shard {path} is missing") from err
    except (pl.exceptions.PolarsError, OSError) as err:
        raise CorruptShard(path, str(err) or type(err).__name__) from err


def bad_shards(home_dir: str | Path, *, deep: bool = False) -> dict[Path, str]:
    """The shards under ``home_dir`` that do not open, with the reason (``shard_error``)."""
    out = {}
    for table in TABLES:
        for path in table_shards(home_dir, table):
            if (why := shard_error(path, deep=deep)) is not None:
                out[path] = why
    return out


class ShardWriter:
    """Writes one run's shards under ``home_dir``; fills ``run_id`` when a frame lacks it.

    >>> w = ShardWriter(tmp, "run-1")
    >>> w.write("nodes", frame, iteration=3, stage="raw_rollouts")   # -> Path
    """

    def __init__(self, home_dir: str | Path, run_id: str, *, strategy: str | None = None):
        self.home_dir = str(home_dir) if objstore.is_remote(home_dir) else Path(home_dir)
        self.run_id = check_name("run_id", run_id)
        self.strategy = strategy
        ensure_schema_shards(self.home_dir)

    def write(self, table: str, frame: pl.DataFrame, *, stage: str, iteration: int | None = None) -> Path:
        fill = []
        if "run_id" not in frame.columns:
            fill.append(pl.lit(self.run_id, dtype=pl.Utf8).alias("run_id"))
        if self.strategy is not None and "strategy" not in frame.columns and "strategy" in TABLES[table]:
            fill.append(pl.lit(self.strategy, dtype=pl.Utf8).alias("strategy"))
        if iteration is not None and "iteration" not in frame.columns and "iteration" in TABLES[table]:
            fill.append(pl.lit(iteration, dtype=pl.Int32).alias("iteration"))
        if fill:
            frame = frame.with_columns(fill)
        return write_shard(self.home_dir, table, frame, run_id=self.run_id, stage=stage, iteration=iteration,
                           schema_checked=True)  # at __init__ (~7 ms a write otherwise: 7 footers, a layout scan)

    def path(self, table: str, *, stage: str, iteration: int | None = None) -> Path:
        """The shard's path (its ``s3://`` URL, a string, under an object-storage home)."""
        if isinstance(self.home_dir, str):
            return shard_url(self.home_dir, table, self.run_id, stage, iteration)
        return shard_path(self.home_dir, table, self.run_id, stage, iteration)

    def remove(self, table: str, *, stage: str, iteration: int | None = None) -> bool:
        """Delete a shard (e.g. a stage that is being re-planned); True if it existed."""
        p = self.path(table, stage=stage, iteration=iteration)
        existed = p.exists()
        p.unlink(missing_ok=True)
        if table == "nodes" and existed:  # the partition's groups without it
            summarise_partition(self.home_dir, p.parent)
        return existed
