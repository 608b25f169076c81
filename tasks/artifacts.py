"""Per-iteration progress lines and Prefect UI artifacts (allocation summary, metrics), the flow
run's name, and the links between the Prefect flow run and the MLflow run."""

from __future__ import annotations

import os
import re

import polars as pl
from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from trace_core.config import TrainConfig
from trace_core.config.io import config_hash
from trace_core.home.layout import shard_path
from trace_core.home.shards import read_shard
from trace_core.stages.results import IterationResults
from trace_core.stages.run import RunRef
from tracking.links import mlflow_link_markdown


def _key(*parts: object) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(map(str, parts)).lower()).strip("-")[:100]


def progress_line(i: int, results: IterationResults, row: dict) -> str:
    roots, raw, pre, ext, ver = results.roots, results.raw, results.prefixes, results.extensions, results.verified
    secs = sum(results.stage_seconds().values())
    return (f"iter {i}: roots {roots.active}/{roots.candidates} prompts, {raw.trajectories} raw "
            f"@ {raw.tokens_per_s:.0f} tok/s | prefixes {pre.branched}/{pre.prefixes} branched, "
            f"{ext.continuations} continuations"
            + (f" + {ext.refill_trajectories} second-wave raw" if ext.refill_trajectories else "")
            + f" | budget {row['budget_used']}/{row['budget_asked']} | "
            f"effective {ver.effective_ratio:.1%} (wasted {ver.wasted}) | train reward "
            f"{ver.train_reward:.2f} | loss {results.update.loss or 0.0:+.4f}"
            + (f" | held-out acc {row['accuracy']:.1%}" if row.get("accuracy") is not None else "")
            + f" | {secs:.1f}s")


def allocation_summary(prompts: pl.DataFrame) -> list[dict]:
    """Per (task, difficulty): candidates, chosen, rollouts, mean predicted v, successes."""
    g = (prompts.group_by("task", "difficulty")
         .agg(pl.len().alias("candidates"), (pl.col("m_alloc") > 0).sum().alias("chosen"),
              pl.col("m_alloc").sum().alias("rollouts"),
              pl.col("v_pred").cast(pl.Float64).mean().round(3).alias("mean_v_pred"),  # float32 prints 0.7279999852
              pl.col("n_success").sum().alias("successes"))
         .sort("task", "difficulty"))
    return g.to_dicts()


def publish_iteration(ref: RunRef, cfg: TrainConfig, i: int, results: IterationResults, row: dict) -> None:
    """One progress line in the flow log; table + markdown artifacts in the Prefect UI."""
    log = get_run_logger()
    log.info(progress_line(i, results, row))
    prompts = read_shard(shard_path(ref.home, "prompts", ref.run_id, "final", i))
    create_table_artifact(key=_key("allocation", ref.run_id), table=allocation_summary(prompts),
                          description=f"Root allocation of iteration {i} ({cfg.allocation.strategy})")
    ver, stage_times = results.verified, results.stage_seconds()
    md = [f"### {ref.run_id}: iteration {i}", "", "| metric | value |", "|---|---|",
          f"| strategy | {cfg.allocation.strategy} |",
          f"| budget used / asked | {row['budget_used']} / {row['budget_asked']} |",
          f"| tokens | {row['tokens']} |", f"| effective ratio | {ver.effective_ratio:.3f} |",
          f"| wasted trajectories | {ver.wasted} |",
          f"| effective per 1k tokens | {ver.effective_per_1k_tokens:.2f} |",
          f"| train reward | {ver.train_reward:.3f} |"]
    if row.get("accuracy") is not None:
        md.append(f"| held-out accuracy | {row['accuracy']:.3f} |")
    md += ["", "| stage | seconds |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in stage_times.items()]
    create_markdown_artifact(key=_key("metrics", ref.run_id), markdown="\n".join(md),
                             description=f"Metrics of iteration {i}")


def prefect_link_tags() -> dict[str, str]:
    """MLflow tags naming the current Prefect flow run: its id, and its page in the Prefect UI
    when a server is configured (``PREFECT_API_URL`` / ``PREFECT_UI_URL`` in the environment; the
    temporary server ``trace-rl train`` starts by itself has no UI and ends with the command)."""
    from prefect.runtime import flow_run
    from prefect.utilities.urls import url_for

    run_id = flow_run.get_id()
    if run_id is None:
        return {}
    tags = {"prefect.flow_run_id": str(run_id)}
    if (os.environ.get("PREFECT_API_URL") or os.environ.get("PREFECT_UI_URL")) and (
            url := url_for("flow-run", obj_id=run_id)):
        tags["prefect.flow_run_url"] = url
    return tags


def run_tags(run_id: str, cfg: TrainConfig) -> list[str]:
    """Prefect tags of a training run's flow run and of all its task runs: run id, strategy and
    config hash (filterable in the Prefect UI); task runs add ``iteration:N`` (``iteration_tag``)."""
    return [f"run:{run_id}", f"strategy:{cfg.allocation.strategy}", f"config:{config_hash(cfg)}"]


def iteration_tag(i: int) -> str:
    return f"iteration:{i}"


def tag_flow_run(tags: list[str]) -> None:
    """Add ``tags`` to the current flow run (a flow's decorator tags are fixed; these are the run's)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if (run_id := flow_run.get_id()) is None:
        return
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(run_id).tags or []
        client.update_flow_run(run_id, tags=sorted(set(current) | set(tags)))


def name_flow_run(name: str) -> None:
    """Rename the current flow run (a run id generated inside the flow, after Prefect named it)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if (run_id := flow_run.get_id()) is not None and flow_run.get_name() != name:
        with get_client(sync_client=True) as client:
            client.set_flow_run_name(run_id, name)


def publish_mlflow_link(run_id: str, link: dict) -> None:
    """A markdown artifact on the flow run naming the MLflow run that holds its metrics (and its
    URL on a tracking server): the Prefect side of the link between the two UIs."""
    create_markdown_artifact(key=_key("mlflow", run_id), markdown=mlflow_link_markdown(run_id, link),
                             description=f"MLflow run of {run_id}")
