"""The node store: Parquet shards under a home directory, read through DuckDB views.

    layout     table schemas, shard paths, the atomic file write
    shards     rows conformed to their table, written (``ShardWriter``), read, checked
    migrate    homes in the older ``run=R/iter=N`` layout moved into the current one
    objstore   a home on object storage (``s3://bucket/prefix``)
    catalogue  the DuckDB side: ``DIR/trace.duckdb`` and ``query`` (the only module importing duckdb)
    queries    the named queries of ``sql/`` (``trace-rl sql NAME``)
    run_row    the ``runs`` table: one row per run, its status
    lock       one writer per run (``runs/<id>/writer.lock``)

The catalogue's names are exported here (``from trace_core.store import query``); the rest are
imported from their module.
"""

from trace_core.store.catalogue import (
    CATALOG_FILE,
    catalog_path,
    connect,
    ensure_catalog,
    has_store,
    open_catalog,
    query,
    schema_sha,
    schema_sql,
    sql_dir,
    statement_params,
)

__all__ = [
    "CATALOG_FILE",
    "catalog_path",
    "connect",
    "ensure_catalog",
    "has_store",
    "open_catalog",
    "query",
    "schema_sha",
    "schema_sql",
    "sql_dir",
    "statement_params",
]
