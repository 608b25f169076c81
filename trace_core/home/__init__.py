"""The node store's files: Parquet shards under a home directory (DuckDB reads them in ``trace_core.store``).

    layout     table schemas, shard paths, the atomic file write
    shards     rows conformed to their table, written (``ShardWriter``), read, checked
    groups     the group summaries: one row per sampling group, written beside each node partition
    migrate    homes in the older ``run=R/iter=N`` layout moved into the current one
    objstore   a home on object storage (``s3://bucket/prefix``)
    queries    the named queries of ``sql/`` (``trace-rl sql NAME``)
    run_row    the ``runs`` table: one row per run, its status
    lock       one writer per run (``runs/<id>/writer.lock``)

None of these modules imports duckdb: ``trace_core/store.py`` (the catalogue ``DIR/trace.duckdb``
and ``query``) is the only one that does. Names are imported from their module.
"""
