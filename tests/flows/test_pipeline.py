"""The pipelined flow (run.max_staleness = 1) on the shipped tiny checkpoint (in-process rollouts),
under a real (temporary) Prefect server: the staleness bound holds node by node, the rollout
side of the next iteration overlaps the update in Prefect's task runs, the plan reads only
outcomes from its past, and MLflow records the staleness, the waits and the importance ratios."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from trace_core.config import load_train_config
from trace_core.policy.model import TINY_WARM_DIR

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# an evaluation after every iteration: the update side's work on an iteration (update, evaluation,
# record) lasts seconds, so the overlap shows beside Prefect's task start-up (~2.5 s here; 48 tasks,
# ~1.4 s, lost that race about half the time)
PIPELINE = ["run.max_staleness=1", "run.iterations=3", "run.threads=1", "run.eval_tasks=192", "run.eval_every=1"]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


@pytest.fixture(scope="module")
def piped(prefect_server, tmp_path_factory):
    from flows.train import train_flow

    home = tmp_path_factory.mktemp("home")
    cfg = load_train_config(CONFIGS / "small-ci.yaml", PIPELINE)
    out = train_flow(cfg, run_id="pipe", home=str(home))
    return home, cfg, out


def _table(home: Path, table: str) -> pl.DataFrame:
    return pl.read_parquet(home / "shards" / table / "run_id=pipe" / "**" / "final.parquet", hive_partitioning=False)


def test_update_never_trains_on_nodes_older_than_the_bound(piped):
    """Iteration i's trees come from version max(0, i - 1); update i trains version i (it wrote
    checkpoint iter=i, version i + 1): no generated node is more than S = 1 version behind."""
    home, cfg, out = piped
    nodes = _table(home, "nodes")
    versions = dict(nodes.group_by("iteration").agg(pl.col("policy_version").unique()).iter_rows())
    assert {i: sorted(v) for i, v in versions.items()} == {0: [0], 1: [0], 2: [1]}
    lag = nodes.select((pl.col("iteration") - pl.col("policy_version")).max()).item()
    assert lag <= cfg.run.max_staleness
    assert [r["iteration"] for r in out["iterations"]] == [0, 1, 2]
    assert nodes["node_id"].n_unique() == nodes.height


def test_next_rollouts_run_beside_the_update_in_prefect(piped):
    """Prefect's task runs: the rollout side of iteration 1 starts before the update side is done
    with iteration 0 — its update, evaluation and record (the synchronous flow starts it after all
    three; the tiny update alone can end within Prefect's task start-up, so its end is not the mark)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:  # the session's server holds other modules' runs too
        found = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="pipe iter")))
    runs = {r.name: r for r in found if r.name.endswith(("pipe iter 0", "pipe iter 1"))}
    update0, record0 = runs["update-policy pipe iter 0"], runs["record-iteration pipe iter 0"]
    first1 = runs["refresh-predictor pipe iter 1"]
    assert first1.start_time < record0.end_time, (first1.start_time, update0.start_time, update0.end_time,
                                                  record0.end_time)


def test_plan_reads_only_its_past_and_the_freshest_outcomes(piped):
    """Each iteration's allocation was fitted on outcomes no newer than the weights it samples
    with, and on the newest ones there were (the previous iterations' versions)."""
    home, _, _ = piped
    nodes, prompts = _table(home, "nodes"), _table(home, "prompts")
    plans = prompts.group_by("iteration").agg(pl.col("policy_version").first(), pl.col("outcome_version").first())
    for i, policy_version, outcome_version in plans.sort("iteration").iter_rows():
        assert outcome_version <= policy_version
        past = nodes.filter(pl.col("iteration") < i)["policy_version"].max()
        assert outcome_version == (0 if past is None else past)  # iteration 0: the warm start's held-out prior
    predictions = _table(home, "predictions")
    assert (predictions["outcome_version"] <= predictions["policy_version"]).all()


def test_mlflow_records_staleness_waits_and_importance_ratios_once(piped):
    from mlflow.tracking import MlflowClient

    home, cfg, _ = piped
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    run_id = (home / "runs" / "pipe" / "mlflow_run_id").read_text().strip()
    for key in ("pipeline/staleness_max", "pipeline/update_waited_s", "pipeline/rollouts_waited_s",
                "update/is_weight", "update/is_weight_max", "update/is_truncated"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(cfg.run.iterations)), key
    lags = {m.step: m.value for m in client.get_metric_history(run_id, "pipeline/staleness_max")}
    assert lags == {0: 0.0, 1: 1.0, 2: 1.0}


def test_the_documented_staleness_query_answers(piped):
    """The SQL example of docs/concepts/pipeline.md on the run's store: one row per iteration,
    the update's staleness 0, 1, 1 and the plan's within it."""
    from trace_core.store import ensure_catalog, query

    home, _, _ = piped
    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "pipeline.md").read_text()
    sql = page.split("```sql\n", 1)[1].split("```", 1)[0]
    ensure_catalog(home)
    f = query(home, sql, {"run_id": "pipe"})
    assert f["iteration"].to_list() == [0, 1, 2]
    assert f["update_staleness"].to_list() == [0, 1, 1]
    assert f["plan_staleness"].to_list() == [0, 0, 1]
    assert (f["wasted"] <= f["trajectories"]).all()
