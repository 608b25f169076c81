"""Group summaries: one row per sampling group of an iteration, written once beside its nodes.

A *raw group* is the raw rollouts of one prompt in one iteration (anchor: the prompt's root); an
*extension group* is the continuations from one prefix node plus the raw trajectory through it
(its owner). ``group_rows`` computes them from one iteration's node table, the same definitions
as the ``trajectory_groups_from_nodes`` view of ``sql/schema.sql`` (a test checks every named
query answers alike from both). The writer of a node shard writes its partition's summary
(``trace_core.home.shards.write_shard``); a home written before the summaries gets them when it is
next opened (``backfill_groups``), so the named queries read ``trajectory_groups`` shards only.

Rows are sorted by ``SORT_KEYS['trajectory_groups']`` so a filter on task or depth skips row
groups by their statistics; at ~1 group per 10 nodes, scanning them is what makes the
wasted-rollout queries independent of the node count's constant factor. Beside each group summary
sits the partition's prompt summary (``prompt_rows``: its groups summed per prompt, half the rows),
what the one question grouping by prompt reads (``sql/top_wasted_prompts.sql``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from pathlib import Path

import polars as pl

from trace_core.home.layout import (
    GROUP_SCHEMA,
    PROMPT_GROUP_SCHEMA,
    ROW_GROUP_ROWS,
    SCHEMA_SHARD,
    SORT_KEYS,
    CorruptShard,
    shard_path,
    table_dir,
    write_parquet_atomic,
)
from trace_core.nodes import with_anchors

log = logging.getLogger(__name__)

SUMMARY_STAGE = "summary"  # the one group shard of a (run, iteration) partition
_KEYS = ["run_id", "iteration"]
# the node columns the summaries read (a partition's other shards are read with these only)
NODE_COLUMNS = ("run_id", "strategy", "iteration", "node_id", "parent_id", "prompt_id", "trajectory_id", "task",
                "difficulty", "depth", "anchor_id", "anchor_trajectory_id", "new_tokens", "is_leaf", "reward")


def _leaf(col: str) -> pl.Expr:
    return pl.col(col).filter(pl.col("is_leaf").fill_null(False))


def _anchored(steps: pl.DataFrame) -> pl.DataFrame:
    """Every group keyed by its anchor, from one aggregation over the nodes below the roots."""
    reward = _leaf("reward").cast(pl.Float64)
    first = [pl.col(c).drop_nulls().first().alias(c) for c in ("strategy", "prompt_id", "task", "difficulty")]
    return steps.group_by(*_KEYS, "anchor_id").agg(
        *first,
        pl.col("anchor_trajectory_id").drop_nulls().first().alias("owner_id"),  # null: a raw group
        (pl.col("depth").min() - 1).cast(pl.Int32).alias("anchor_depth"),
        pl.col("is_leaf").fill_null(False).sum().cast(pl.Int64).alias("trajectories"),
        pl.col("new_tokens").sum().cast(pl.Int64).alias("tokens"),
        pl.when(reward.count() > 0).then(reward.sum()).alias("successes"),  # SQL: NULL over no reward
        reward.max().alias("max_reward"),
        reward.min().alias("min_reward"),
    )


def _owners(steps: pl.DataFrame, anchored: pl.DataFrame) -> pl.DataFrame:
    """The raw trajectories extension groups branch from: their reward, tokens and root."""
    wanted = anchored.filter(pl.col("owner_id").is_not_null()).select(*_KEYS, pl.col("owner_id").alias("trajectory_id"))
    return (steps.join(wanted.unique(), on=[*_KEYS, "trajectory_id"], how="semi")
            .group_by(*_KEYS, "trajectory_id").agg(
                pl.col("anchor_id").drop_nulls().first().alias("root_id"),
                _leaf("reward").cast(pl.Float64).max().alias("owner_reward"),
                pl.col("new_tokens").sum().cast(pl.Int64).alias("owner_tokens"))
            .rename({"trajectory_id": "owner_id"}))


def group_rows(nodes: pl.DataFrame) -> pl.DataFrame:
    """One row per raw and extension group of ``nodes`` (one or more iterations' node tables,
    anchor columns filled), with exactly ``GROUP_SCHEMA``'s columns, sorted for pruning."""
    if "anchor_id" not in nodes.columns:
        nodes = with_anchors(nodes)
    steps = nodes.filter((pl.col("depth") > 0) & pl.col("anchor_id").is_not_null())
    anchored = _anchored(steps)
    ext = (anchored.filter(pl.col("owner_id").is_not_null())
           .join(_owners(steps, anchored), on=[*_KEYS, "owner_id"], how="left")
           .with_columns((pl.max_horizontal("max_reward", "owner_reward")
                          > pl.min_horizontal("min_reward", "owner_reward")).fill_null(False).alias("contrastive")))
    credit = (ext.filter("contrastive").unique([*_KEYS, "root_id", "owner_id", "owner_tokens"])
              .group_by(*_KEYS, "root_id").agg(pl.len().cast(pl.Int64).alias("credit"),
                                                pl.col("owner_tokens").sum().cast(pl.Int64).alias("credit_tokens")))
    raw_contrast = pl.col("max_reward") > pl.col("min_reward")
    raw = (anchored.filter(pl.col("owner_id").is_null())
           .join(credit, left_on=[*_KEYS, "anchor_id"], right_on=[*_KEYS, "root_id"], how="left")
           .select(*_KEYS, "strategy", "prompt_id", "task", "difficulty", pl.lit("raw").alias("origin"),
                   pl.lit(None, pl.Utf8).alias("anchor_id"), pl.lit(0, pl.Int32).alias("anchor_depth"),
                   "trajectories", "tokens", "successes", raw_contrast.fill_null(False).alias("contrastive"),
                   pl.when(raw_contrast).then("trajectories").otherwise(pl.col("credit").fill_null(0))
                   .alias("effective"),
                   pl.when(raw_contrast).then("tokens").otherwise(pl.col("credit_tokens").fill_null(0))
                   .alias("effective_tokens"),
                   pl.lit(None, pl.Utf8).alias("owner_trajectory_id"), pl.lit(None, pl.Float64).alias("owner_reward"),
                   pl.col("trajectories").alias("group_size"), pl.col("successes").alias("group_successes"),
                   pl.lit(None, pl.Int64).alias("flips")))
    flips = pl.when(pl.col("owner_reward") >= 1).then(pl.col("trajectories") - pl.col("successes")) \
        .otherwise(pl.col("successes")).round(0, mode="half_away_from_zero")  # SQL casts DOUBLE -> BIGINT so
    ext = ext.select(*_KEYS, "strategy", "prompt_id", "task", "difficulty", pl.lit("extension").alias("origin"),
                     "anchor_id", "anchor_depth", "trajectories", "tokens", "successes", "contrastive",
                     pl.when("contrastive").then("trajectories").otherwise(0).alias("effective"),
                     pl.when("contrastive").then("tokens").otherwise(0).alias("effective_tokens"),
                     pl.col("owner_id").alias("owner_trajectory_id"), "owner_reward",
                     (pl.col("trajectories") + 1).alias("group_size"),
                     (pl.col("successes") + pl.col("owner_reward")).alias("group_successes"), flips.alias("flips"))
    out = pl.concat([raw, ext], how="vertical_relaxed")
    out = out.select(pl.col(c).cast(dt) for c, dt in GROUP_SCHEMA.items())
    return out.sort([*_KEYS, *SORT_KEYS["trajectory_groups"]], nulls_last=True)


def prompt_rows(groups: pl.DataFrame) -> pl.DataFrame:
    """One row per (run, iteration, prompt) of ``group_rows``' output, its groups summed, with
    exactly ``PROMPT_GROUP_SCHEMA``'s columns (the ``prompt_groups`` view over the groups recomputed
    from the nodes, ``sql/catalog/groups_from_nodes.sql``, is the same definition). Strategy, task
    and difficulty are keys too (one value a prompt), so a sum over them equals the groups' sum."""
    successes = pl.col("successes")
    out = groups.group_by(*_KEYS, *_PROMPT_KEYS).agg(
        (pl.col("origin") == "raw").sum().alias("raw_groups"),
        pl.len().alias("groups"),
        *[pl.col(c).sum() for c in ("trajectories", "tokens", "effective", "effective_tokens")],
        pl.when(successes.count() > 0).then(successes.sum()).alias("successes"),  # SQL: NULL over no reward
        (pl.col("trajectories") - pl.col("effective")).sum().alias("wasted"),
    )
    return (out.select(pl.col(c).cast(dt) for c, dt in PROMPT_GROUP_SCHEMA.items())
            .sort([*_KEYS, "task", "difficulty", "prompt_id", "strategy"], nulls_last=True))


_PROMPT_KEYS = ("prompt_id", "strategy", "task", "difficulty")


# ----------------------------------------------------------------------------- a local partition
def node_shards(part: Path) -> list[Path]:
    """The node shards of one ``run_id=R/iteration=N`` directory (no temporary files)."""
    return sorted(p for p in part.glob("*.parquet") if p.name != SCHEMA_SHARD)


def read_partition(files: list[Path], skip: Path | None = None) -> pl.DataFrame:
    """The summary columns of ``files`` (but ``skip``), concatenated."""
    frames = []
    for f in files:
        if f == skip:
            continue
        try:
            cols = [c for c in NODE_COLUMNS if c in pl.read_parquet_schema(f)]
            frames.append(pl.read_parquet(f, columns=cols))
        except (pl.exceptions.PolarsError, OSError) as err:
            raise CorruptShard(f, str(err) or type(err).__name__) from err
    if not frames:
        return pl.DataFrame()
    whole = pl.concat(frames, how="diagonal_relaxed")
    return whole if "anchor_id" in whole.columns else with_anchors(whole)


def summary_path(home_dir: str | Path, run_id: str, iteration: int, table: str = "trajectory_groups") -> Path:
    """The partition's group summary, or with ``table="prompt_groups"`` its prompt summary."""
    return shard_path(home_dir, table, run_id, SUMMARY_STAGE, iteration)


def write_summaries(groups: pl.DataFrame, home_dir: str | Path, run_id: str, iteration: int) -> Path:
    """The partition's prompt summary, then its group summary (the one whose time says the
    partition is summarised, ``stale_partitions``); returns the group summary's path."""
    write_parquet_atomic(prompt_rows(groups), summary_path(home_dir, run_id, iteration, "prompt_groups"))
    target = summary_path(home_dir, run_id, iteration)
    return write_parquet_atomic(groups, target, row_group_size=ROW_GROUP_ROWS["trajectory_groups"])


def _partition_key(part: Path) -> tuple[str, int]:
    return part.parent.name.removeprefix("run_id="), int(part.name.removeprefix("iteration="))


def _changed(part: Path) -> int:
    """When the partition last changed: a shard written in place, or one added, renamed or
    removed (its directory's own time)."""
    with os.scandir(part) as entries:
        shards = [e.stat().st_mtime_ns for e in entries if e.name.endswith(".parquet") and e.name != SCHEMA_SHARD]
    return max([part.stat().st_mtime_ns, *shards])


def _partitions(table_root: Path) -> dict[tuple[str, str], Path]:
    """The ``run_id=R/iteration=N`` directories under a table's directory, by their two names."""
    out = {}
    if not table_root.is_dir():
        return out
    with os.scandir(table_root) as runs:
        for run in runs:
            if run.name.startswith("run_id=") and run.is_dir():
                with os.scandir(run.path) as its:
                    out.update({(run.name, it.name): Path(it.path) for it in its
                                if it.name.startswith("iteration=") and it.is_dir()})
    return out


def stale_partitions(home_dir: str | Path) -> list[Path]:
    """Node partitions whose summaries (groups, prompts) are missing or older than their last
    change. Every query opens the home with this check, so it stats directories and files only
    (~4 a partition)."""
    summaries = [_partitions(table_dir(home_dir, t)) for t in ("trajectory_groups", "prompt_groups")]
    out = []
    for key, part in _partitions(table_dir(home_dir, "nodes")).items():
        try:
            done = min((s[key] / f"{SUMMARY_STAGE}.parquet").stat().st_mtime_ns for s in summaries)
        except (KeyError, FileNotFoundError):
            done = -1
        if done < _changed(part):
            out.append(part)
    return sorted(out)


def summarise_partition(home_dir: str | Path, part: Path, frame: pl.DataFrame | None = None,
                        written: Path | None = None) -> Path | None:
    """(Re)write the summary of one local node partition; ``frame``: the rows of its shard
    ``written``, just written (not read back). Repeated while the node shards change under it
    (another writer), so the summary left behind reflects the shards last seen."""
    run_id, iteration = _partition_key(part)
    target = summary_path(home_dir, run_id, iteration)
    for _ in range(5):
        files = node_shards(part)
        if not files:
            target.unlink(missing_ok=True)
            summary_path(home_dir, run_id, iteration, "prompt_groups").unlink(missing_ok=True)
            return None
        seen = _changed(part)
        rest = read_partition(files, skip=written if frame is not None else None)
        mine = None if frame is None else frame.select([c for c in NODE_COLUMNS if c in frame.columns])
        whole = rest if mine is None else pl.concat([mine, rest], how="diagonal_relaxed") if rest.height else mine
        write_summaries(group_rows(whole), home_dir, run_id, iteration)
        if _changed(part) == seen:
            return target
        frame = written = None  # changed meanwhile: read everything again
    log.warning("summary %s left as last written: its node shards kept changing", target)
    return target


def backfill_groups(home_dir: str | Path, skip: Collection[Path] = ()) -> dict[Path, str]:
    """Write the summaries a home lacks (written before them, or by an older writer), saying so in
    one line. Partitions holding a shard of ``skip`` are left alone. Returns the stale partitions
    it could not summarise, each as the node shard that does not open (its summary stays as it
    was) or as the partition itself when the home is not writable, with the reason: the caller
    reads groups from the nodes then, where the damage is named or the rows are current."""
    held = {Path(p).resolve().parent for p in skip}
    stale = [p for p in stale_partitions(home_dir) if p.resolve() not in held]
    left: dict[Path, str] = {}
    for part in stale:
        try:
            summarise_partition(home_dir, part)
        except CorruptShard as err:
            left[err.path] = err.reason
        except PermissionError as err:
            left[part] = f"not writable: {err}"
    if done := len(stale) - len(left):
        log.warning("wrote group summaries for %d node partitions of %s (written before them, or changed since)",
                    done, home_dir)
    if left:  # a damaged shard is named by whoever reads it (a query, the catalogue): one line, not two
        (log.warning if any(p.is_dir() for p in left) else log.info)(
            "group summaries of %d node partitions of %s left as they were (first: %s, %s): their groups are "
            "read from the nodes", len(left), home_dir, *next(iter(left.items())))
    return left
