"""The DuckDB side of the node store: the catalogue file and query execution.

Training writes only Parquet shards (``trace_core.home.shards``); DuckDB reads them through views
defined in ``sql/schema.sql``. The catalogue's views hold absolute paths under the home
directory ``DIR`` (rebuilt if ``DIR`` moves), so ``duckdb -readonly DIR/trace.duckdb`` works
from anywhere.

DuckDB allows one writing process or many reading ones per database file. So the training
process never keeps ``DIR/trace.duckdb`` open: it creates the file once (or again if it is
missing or its schema is stale), and a lock held by someone else only produces a warning.
Python queries (``query``) run on a private in-memory database carrying the same views, so they
never contend for the catalogue's lock either. This is the only module that imports duckdb.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import warnings
from collections.abc import Collection
from pathlib import Path

import duckdb
import polars as pl

from trace_core.home import objstore
from trace_core.home.layout import (
    GLOB_CHARS,
    SCHEMA_SHARD,
    TABLES,
    check_home_path,
    table_glob,
    table_shards,
)
from trace_core.home.shards import CorruptShard, bad_shards, ensure_schema_shards

log = logging.getLogger(__name__)

CATALOG_FILE = "trace.duckdb"
# The catalogue file's storage format: the oldest DuckDB 1.x format, so that the DuckDB CLI users
# install (PyPI's duckdb-cli 1.5.6 reads storage versions 64-68; this library writes 69 by default)
# and older Python clients open it. It holds only views and a stamp: no newer format feature is used.
CATALOG_STORAGE_VERSION = "v1.0.0"
_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def sql_dir() -> Path:
    """Directory of ``schema.sql`` and the named queries (``TRACE_RL_SQL_DIR`` overrides)."""
    override = os.environ.get("TRACE_RL_SQL_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[1] / "sql"


def _literal(path: str | Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def schema_sql(home_dir: str | Path | None = None, exclude: Collection[Path] = ()) -> str:
    """``sql/schema.sql``; with ``home_dir``, its shard globs made absolute under that home, so
    the catalogue file answers from any working directory (DuckDB CLI, notebooks, Python).
    ``exclude``: shard files to leave out (unreadable ones); a table holding one reads an
    explicit list of its other files instead of its glob."""
    text = (sql_dir() / "schema.sql").read_text()
    if home_dir is None:
        return text
    if objstore.is_remote(home_dir):  # s3://bucket/prefix: read through the registered filesystem
        if set(str(home_dir)) & GLOB_CHARS:
            raise ValueError(f"home {str(home_dir)!r} holds glob characters; choose a prefix without them")
        return text.replace("read_parquet('shards/", f"read_parquet({_literal(str(home_dir).rstrip('/'))[:-1]}/shards/")
    home = check_home_path(home_dir)
    text = text.replace("read_parquet('shards/", f"read_parquet({_literal(home)[:-1]}/shards/")
    skip = {Path(p).resolve() for p in exclude}
    for table in sorted({p.relative_to(home / "shards").parts[0] for p in skip}):
        keep = [_literal(f) for f in table_shards(home, table) if f.resolve() not in skip and f.name != SCHEMA_SHARD]
        text = text.replace(f"read_parquet({_literal(home / table_glob(table))}",
                            f"read_parquet([{', '.join(keep)}]::VARCHAR[]")
    return text


# A table's view in schema.sql: its empty schema shard unioned with the hive-partitioned glob of
# its data shards, which may match nothing yet (allow_empty: DuckDB 2 only).
_TABLE_VIEW = re.compile(
    r"SELECT \* FROM read_parquet\('(?P<dir>[^']*/shards/(?P<table>\w+))/_schema\.parquet'\)\s*"
    r"UNION ALL BY NAME\s*SELECT \* FROM read_parquet\('(?P=dir)/[^']*\.parquet', hive_partitioning = true,"
    r"\s*hive_types = \{[^}]*\}, allow_empty = true\)")


def catalog_sql(home_dir: str | Path) -> str:
    """The DDL of the catalogue file: ``schema_sql(home_dir)`` with each table's view in a form
    DuckDB 1.x reads too (the CLI users install): one glob over the table's directory, which always
    matches its schema shard, read without hive partitioning (every shard also stores its
    ``run_id`` and ``iteration`` columns). It answers the same; only Python queries (``query``)
    skip the other runs' files before reading them."""
    guard = _home_guard(home_dir)
    text, n = _TABLE_VIEW.subn(lambda m: f"SELECT * FROM read_parquet('{m['dir']}/**/*.parquet', "
                                         f"hive_partitioning = false) WHERE {guard}",
                               schema_sql(home_dir))
    if n != len(TABLES):
        raise RuntimeError(f"sql/schema.sql: {n} table views in the expected form, {len(TABLES)} tables")
    return text


def _home_guard(home_dir: str | Path) -> str:
    """A condition true only where the catalogue file is open at the path it was built for.

    The views hold absolute globs, so a copied or moved ``trace.duckdb`` would read the original
    home's shards; DuckDB reports every attached file's real path (``duckdb_databases()``), so in
    a copy the views refuse with one line naming the fix instead (any ``trace-rl`` command on the
    copy rebuilds its catalogue for it)."""
    built = str(catalog_path(Path(home_dir).resolve()))
    if "'" in built:
        raise ValueError(f"home path {built} holds a quote: it cannot sit in the catalogue's SQL")
    here = built[: -len(CATALOG_FILE) - 1]
    message = (f"this catalogue was built for {here}, not for the copy or move opened here: run "
               "`trace-rl sql iteration_summary --home <this home>` once to rebuild it for this home")
    return (f"(SELECT CASE WHEN count(*) FILTER (WHERE path = '{built}') > 0 THEN true "
            f"ELSE error('{message}') END FROM duckdb_databases())")


def schema_sha(home_dir: str | Path | None = None) -> str:
    """Version of the views: the schema text and the home it points at (a moved home rebuilds),
    and the catalogue file's storage format."""
    return hashlib.sha256((CATALOG_STORAGE_VERSION + schema_sql(home_dir)).encode()).hexdigest()[:16]


def catalog_path(home_dir: str | Path) -> Path:
    return Path(home_dir) / CATALOG_FILE


def _config(home_dir: Path) -> dict:
    """The search path makes the views' relative globs resolve under this home directory, whatever
    the process's working directory. Threads and memory are DuckDB's defaults (all cores, 80% of
    memory) unless ``TRACE_RL_DUCKDB_THREADS`` / ``TRACE_RL_DUCKDB_MEMORY_LIMIT`` (e.g. ``8GB``) say
    otherwise: a machine shared with training, or the store benchmark."""
    config = {"file_search_path": str(home_dir.resolve())}
    if threads := os.environ.get("TRACE_RL_DUCKDB_THREADS"):
        config["threads"] = int(threads)
    if memory := os.environ.get("TRACE_RL_DUCKDB_MEMORY_LIMIT"):
        config["memory_limit"] = memory
    return config


def _apply_schema(con: duckdb.DuckDBPyConnection, home: Path) -> None:
    con.execute(catalog_sql(home))


def connect(home_dir: str | Path, exclude: Collection[Path] = (), *,
            from_nodes: bool = False, only_for: str | None = None) -> duckdb.DuckDBPyConnection:
    """A private in-memory DuckDB with the store's views over ``home_dir``'s shards (less the
    files in ``exclude``). An ``s3://`` home is read through pyarrow's S3 filesystem
    (``trace_core.home.objstore``): DuckDB's httpfs extension would have to be downloaded first.
    ``from_nodes``: ``trajectory_groups`` recomputed from the node shards instead of read from the
    stored group summaries (``sql/catalog/groups_from_nodes.sql``). ``only_for``: a statement;
    only the views and macros it uses are created (``needed_schema``)."""
    groups_sql = (sql_dir() / "catalog" / "groups_from_nodes.sql").read_text()
    if objstore.is_remote(home_dir):
        ensure_schema_shards(home_dir)
        con = duckdb.connect(":memory:")
        con.register_filesystem(objstore.fsspec_filesystem())
        schema = schema_sql(home_dir)
    else:
        home = check_home_path(home_dir)  # the search path is globbed too
        # partitions whose summary could not be rewritten (an unreadable node shard): groups from
        # the nodes, so a query over them names the damaged shard instead of answering from an old summary
        from_nodes = bool(ensure_schema_shards(home, skip=exclude)) or from_nodes
        con = duckdb.connect(":memory:", config=_config(home))
        schema = schema_sql(home, exclude)
    if only_for is not None:
        schema = needed_schema(schema, only_for + (groups_sql if from_nodes else ""))
    con.execute(schema)
    if from_nodes:
        con.execute(groups_sql)
    return con


_DEFINES = re.compile(r"CREATE OR REPLACE (?:VIEW|MACRO) (\w+)")
_COMMENT = re.compile(r"--[^\n]*")
_READS = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)", re.IGNORECASE)  # a table, view or table macro read


def needed_schema(schema: str, sql: str) -> str:
    """The statements of ``schema`` (``schema_sql``) that ``sql`` needs: the views and macros it
    names, and those they name, in the schema's order. Creating a view binds it, and binding a
    table's view lists every partition of the table (~0.05 s of CPU per view at 1,000 iterations):
    a named query that reads the group summaries skips the node views' listings this way."""
    defs = {}
    for stmt in duckdb.extract_statements(schema):
        if (m := _DEFINES.search(_COMMENT.sub("", stmt.query))) is None:
            return schema  # a statement this function does not know: all of them
        defs[m[1]] = stmt.query
    want: set[str] = set()
    todo = [_COMMENT.sub("", sql)]
    while todo:  # names read after FROM / JOIN only: a column may share a view's name (trajectories)
        for name in _READS.findall(todo.pop()):
            if name in defs and name not in want:
                want.add(name)
                todo.append(_COMMENT.sub("", defs[name]))
    return ";\n".join(q for name, q in defs.items() if name in want) + ";\n"


def _stamp(con: duckdb.DuckDBPyConnection, home: Path) -> None:
    stamp = (sql_dir() / "catalog" / "stamp.sql").read_text()
    con.execute(stamp, {"schema_sha": schema_sha(home)})


def _stamp_of(path: Path, home: Path) -> str | None:
    with duckdb.connect(str(path), read_only=True, config=_config(home)) as con:
        try:
            row = con.execute((sql_dir() / "catalog" / "read_stamp.sql").read_text()).fetchone()
        except duckdb.CatalogException:
            return None
    return row[0] if row else None


def ensure_catalog(home_dir: str | Path) -> bool:
    """Create ``DIR/trace.duckdb`` if it is missing or its views are stale; True if current.

    Never raises because another process holds the file (read-only readers are the normal
    case while training writes shards): it warns and leaves the existing catalogue alone. The
    views are globs, so new shards show up in an existing catalogue without a refresh.
    """
    if objstore.is_remote(home_dir):
        raise ValueError(f"the catalogue file needs a local home, not {home_dir}; query an object-storage "
                         "home with `trace-rl sql NAME --home s3://...` (trace_core.store.query)")
    home = check_home_path(home_dir)
    home.mkdir(parents=True, exist_ok=True)
    unsummarised = ensure_schema_shards(home)
    path = catalog_path(home)
    try:
        if not unsummarised and path.exists() and _stamp_of(path, home) == schema_sha(home):
            return True
    except duckdb.IOException as err:
        if not _not_a_database(err):
            warnings.warn(f"catalogue {path} is busy, left as it is: {err}", RuntimeWarning, stacklevel=2)
            return False
        aside = path.with_name(f"{path.name}.unreadable")  # not a DuckDB file: kept for a look, rebuilt
        os.replace(path, aside)
        log.warning("catalogue %s is not a DuckDB database (moved to %s); rebuilding it", path, aside.name)
    try:
        _write_catalog(path, home, unsummarised)
        return True
    except (duckdb.IOException, duckdb.ConnectionException) as err:
        warnings.warn(f"catalogue {path} is busy, left as it is: {err}", RuntimeWarning, stacklevel=2)
        return False


def _write_catalog(path: Path, home: Path, unsummarised: dict[Path, str]) -> None:
    """Build the catalogue in a temporary file of the old storage format, then rename it into
    place: a reader sees the old catalogue or the new one, and an existing file written in a newer
    format is replaced rather than kept (DuckDB never downgrades a file in place)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _remove(tmp)
    try:
        _build(tmp, home, unsummarised)
        if path.exists():  # held open by another process: the connect raises and the old file stays
            duckdb.connect(str(path), config=_config(home)).close()
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(db: Path) -> None:
    db.unlink(missing_ok=True)
    db.with_name(db.name + ".wal").unlink(missing_ok=True)


def _not_a_database(err: Exception) -> bool:
    return "not a valid DuckDB database file" in str(err)


def _build(path: Path, home: Path, unsummarised: dict[Path, str]) -> None:
    """Write the views into the new catalogue file ``path``. A shard that does not open (truncated
    in a copied home, say) is left out of the views, named in a warning, and the catalogue is
    stamped stale so the next ``ensure_catalog`` (the end of the run that recomputes it) builds
    the full views. ``unsummarised``: node partitions whose group summary could not be rewritten
    (``backfill_groups``); the catalogue then reads every group from the readable nodes."""
    config = {**_config(home), "storage_compatibility_version": CATALOG_STORAGE_VERSION}
    bad = {p: why for p, why in unsummarised.items() if p.suffix == ".parquet"}
    if not unsummarised:
        try:
            with duckdb.connect(str(path), config=config) as con:
                _apply_schema(con, home)
                _stamp(con, home)
            return
        except (duckdb.IOException, duckdb.ConnectionException):
            raise
        except duckdb.Error:
            bad = bad_shards(home, deep=True)
            if not bad:
                raise
        _remove(path)  # the failed attempt's views
    else:
        bad |= bad_shards(home)  # footers: the other damage a copy may hold
    for shard, why in bad.items():
        log.warning("catalogue %s built without unreadable shard %s (%s)", path, shard, why)
    nodes = home / "shards" / "nodes"
    with duckdb.connect(str(path), config=config) as con:
        con.execute(schema_sql(home, exclude=list(bad)))
        if unsummarised or any(Path(p).resolve().is_relative_to(nodes) for p in bad):
            con.execute((sql_dir() / "catalog" / "groups_from_nodes.sql").read_text())
        con.execute((sql_dir() / "catalog" / "stamp.sql").read_text(), {"schema_sha": "partial"})


def open_catalog(home_dir: str | Path, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """Open ``DIR/trace.duckdb`` (created or refreshed first when possible).

    ``read_only=True`` (the default, and what analysts should use) lets many processes read at
    once; ``read_only=False`` takes DuckDB's exclusive lock and raises if anyone holds the file.
    """
    home = Path(home_dir)
    ensure_catalog(home)
    return duckdb.connect(str(catalog_path(home)), read_only=read_only, config=_config(home))


def statement_params(sql: str) -> list[str]:
    """Names of the ``$name`` parameters a statement uses, in first-use order."""
    return list(dict.fromkeys(_PARAM.findall(sql)))


def has_store(home_dir: str | Path) -> bool:
    """True if ``home_dir`` holds a node store (its ``shards/`` or its catalogue)."""
    if objstore.is_remote(home_dir):
        return objstore.has_objects(f"{str(home_dir).rstrip('/')}/shards")
    home = Path(home_dir)
    return (home / "shards").is_dir() or catalog_path(home).is_file()


def query(home_dir: str | Path, sql: str, params: dict | None = None, *, skip_bad: bool = False,
          from_nodes: bool = False) -> pl.DataFrame:
    """Run one SQL statement (read from a file, never built here) against the store's views.

    Only the parameters the statement names are bound (DuckDB rejects extra ones); a named
    parameter that ``params`` lacks is bound to NULL. A shard that does not open raises
    ``CorruptShard`` naming it; ``skip_bad`` leaves such shards out instead (a warning each).
    ``from_nodes``: groups recomputed from the nodes, not read from their summaries (``connect``).
    """
    given = params or {}
    unknown = set(given) - set(statement_params(sql))
    if unknown - {"run_id"}:
        raise ValueError(f"parameters {sorted(unknown)} are not used by the statement")
    bound = {name: given.get(name) for name in statement_params(sql)}
    if objstore.is_remote(home_dir):  # no local files to check one by one
        with connect(home_dir, from_nodes=from_nodes, only_for=sql) as con:
            return con.sql(sql, params=bound).pl()
    skip = _skipped(bad_shards(home_dir)) if skip_bad else {}  # footers: cheap, catches truncation
    try:
        return _run(home_dir, sql, bound, skip, from_nodes)
    except (duckdb.Error, CorruptShard) as err:  # CorruptShard: a node shard the group summaries read
        bad = {p: why for p, why in bad_shards(home_dir, deep=True).items() if p not in skip}
        if not bad:
            raise
        if not skip_bad:
            path, why = next(iter(bad.items()))
            raise CorruptShard(path, f"{why} ({len(bad)} unreadable shard(s); --skip-bad queries the rest)") from err
    return _run(home_dir, sql, bound, skip | _skipped(bad), from_nodes)  # damage past the footer, found by reading


def _run(home_dir: str | Path, sql: str, bound: dict, skip: dict[Path, str], from_nodes: bool) -> pl.DataFrame:
    """One statement on a fresh connection without the ``skip`` shards; when node shards are
    skipped, groups come from the readable nodes (the stored summaries count the skipped ones)."""
    nodes = check_home_path(home_dir) / "shards" / "nodes"
    from_nodes = from_nodes or any(Path(p).resolve().is_relative_to(nodes) for p in skip)
    with connect(home_dir, exclude=skip, from_nodes=from_nodes, only_for=sql) as con:
        return con.sql(sql, params=bound).pl()


def _skipped(bad: dict[Path, str]) -> dict[Path, str]:
    for path, why in bad.items():
        log.warning("skipped corrupt shard %s: %s", path, why)
    return bad
