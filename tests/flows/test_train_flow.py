"""The real training flow on the shipped tiny checkpoint, under a real (temporary) Prefect server."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest

from trace_core.config import load_train_config
from trace_core.policy.model import TINY_WARM_DIR

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


@pytest.fixture(scope="module")
def trained(prefect_server, tmp_path_factory):
    from flows.train import train_flow

    home = tmp_path_factory.mktemp("home")
    cfg = load_train_config(CONFIGS / "small-ci.yaml")
    out = train_flow(cfg, run_id="e2e", home=str(home))
    return home, cfg, out


def test_flow_writes_every_iteration(trained):
    home, cfg, out = trained
    assert [r["iteration"] for r in out["iterations"]] == list(range(cfg.run.iterations))
    nodes = pl.read_parquet(home / "shards" / "nodes" / "run_id=e2e" / "**" / "final.parquet")
    assert nodes["node_id"].n_unique() == nodes.height  # no duplicated node
    leaves = nodes.filter(pl.col("is_leaf"))
    assert leaves["reward"].null_count() == 0 and leaves["reward_reason"].null_count() == 0
    used = leaves.group_by("iteration").len()["len"].to_list()
    assert all(u <= cfg.allocation.budget_total for u in used)
    assert Path(out["checkpoint"], "model.safetensors").is_file()


def test_catalogue_answers_wasted_queries(trained):
    from trace_core.home.queries import run_named_query
    from trace_core.store import ensure_catalog

    home, _, _ = trained
    ensure_catalog(home)
    wasted = run_named_query(home, "wasted_by_iteration", run_id="e2e")
    assert wasted.height >= 1
    # one definition: the flow's effective ratio is the views' (to the 4 decimals SQL rounds to)
    flow = {r["iteration"]: round(r["effective_ratio"], 4) for r in trained[2]["iterations"]}
    assert dict(wasted.select("iteration", "effective_ratio").iter_rows()) == flow
    con = duckdb.connect(str(home / "trace.duckdb"), read_only=True)
    n = con.execute("select count(*) from nodes where run_id = 'e2e'").fetchone()[0]
    runs = con.execute("select run_id, status, strategy, finished_at >= started_at from runs").fetchall()
    con.close()
    assert n > 0
    assert runs == [("e2e", "finished", trained[1].allocation.strategy, True)]  # the flow's row in the runs view


def test_mlflow_run_has_metrics_and_artifacts(trained):
    from mlflow.tracking import MlflowClient

    home, cfg, out = trained
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    run_id = (home / "runs" / "e2e" / "mlflow_run_id").read_text().strip()
    steps = [m.step for m in client.get_metric_history(run_id, "effective/ratio")]
    assert sorted(steps) == list(range(cfg.run.iterations))  # step = the store's iteration
    arts = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "plots")}
    assert "report.md" in arts and "config.yaml" in arts
    assert any(p.endswith(".png") for p in arts)
    assert "# Run report" in out["report"]


def test_node_table_is_pinned(trained):
    """The same run id, config and seed give the same node table, column for column, as a
    recorded run (tests/data/pinned_nodes_small_ci*.json). One recording per CPU kind: the
    sampled tokens themselves differ between CPUs whose SIMD kernels round differently (the same
    code gives 158 nodes on a machine with AVX-512 and no native bf16, pinned_nodes_small_ci.json,
    and 147 on an AMD EPYC with AVX-512 BF16), so the run must equal one of them. A deliberate change of behaviour
    re-records every one of them, each on its CPU kind:
    `python tests/node_digest.py HOME e2e > tests/data/pinned_nodes_small_ci[.KIND].json`."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from node_digest import node_digest

    home, _, _ = trained
    got = node_digest(pl.read_parquet(home / "shards" / "nodes" / "run_id=e2e" / "**" / "final.parquet"))
    recorded = sorted((Path(__file__).resolve().parents[1] / "data").glob("pinned_nodes_small_ci*.json"))
    assert len(recorded) >= 2
    diffs = {f.name: {k: v for k, v in got.items() if json.loads(f.read_text()).get(k) != v} for f in recorded}
    assert any(not d for d in diffs.values()), min(diffs.items(), key=lambda kv: len(kv[1]))
