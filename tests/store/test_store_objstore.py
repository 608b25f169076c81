"""The node store on object storage: a local S3-compatible server (moto, server mode) started
by the test; shards written with ShardWriter, named queries answered through DuckDB."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_fixture import build_fixture_store, fixture_nodes

from trace_core import store
from trace_core.home import objstore, queries
from trace_core.home.shards import ShardWriter


@pytest.fixture(scope="module")
def s3_home(tmp_path_factory):
    try:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
    except Exception as err:  # noqa: BLE001 - any failure to start means: no server here
        pytest.skip(f"cannot start a local S3 server (moto): {err}")
    host, port = server.get_host_and_port()
    mp = pytest.MonkeyPatch()
    for k, v in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
                 "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
        mp.setenv(k, v)
    import pyarrow.fs as pafs

    pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1",
                      allow_bucket_creation=True).create_dir("pool")
    yield "s3://pool/trace-home"
    mp.undo()
    server.stop()


def test_named_queries_on_object_storage_match_a_local_home(s3_home, tmp_path):
    for (run, it, stage), frame in fixture_nodes().items():
        url = ShardWriter(s3_home, run).write("nodes", frame, iteration=it, stage=stage)
        assert url == f"{s3_home}/shards/nodes/run_id={run}/iteration={it:05d}/{stage}.parquet"
        assert objstore.read_parquet(url).height == frame.height
    local = build_fixture_store(tmp_path)
    for name in ("wasted_by_iteration", "wasted_by_task", "wasted_by_depth", "effective_ratio_by_strategy"):
        assert queries.run_named_query(s3_home, name).equals(queries.run_named_query(local, name)), name
    assert "0.6667" in queries.sql_command("wasted_by_iteration", run_id="r1", home_dir=s3_home)
    assert "0.6667" in queries.sql_command("wasted_by_iteration", run_id="r1", home_dir=Path(s3_home))  # as the CLI passes it


def test_object_storage_filters_skip_files(s3_home):
    ShardWriter(s3_home, "r1").write("nodes", fixture_nodes()[("r1", 1, "raw_rollouts")], iteration=1,
                                     stage="raw_rollouts")
    with store.connect(s3_home) as con:
        plan = con.execute("EXPLAIN ANALYZE SELECT count(*) FROM nodes WHERE run_id = 'r1' AND iteration = 1")
        text = plan.fetchall()[0][1]
    assert "Scanning Files: 2/" in text and "s3://pool/trace-home/shards/nodes/run_id=r1/iteration=00001" in text


def test_object_storage_home_errors_are_one_line(s3_home):
    with pytest.raises(FileNotFoundError, match="no node store under s3://pool/elsewhere"):
        queries.sql_command("wasted_by_iteration", home_dir="s3://pool/elsewhere")
    with pytest.raises(ValueError, match="needs a local home"):
        store.ensure_catalog(s3_home)
    with pytest.raises(ValueError, match="must start with one of"):
        objstore.is_remote("gs://bucket/home")
