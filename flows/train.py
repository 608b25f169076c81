"""The training flow: TRACE, one line a stage.

    for each iteration:
        predictor  <- refresh on every labelled node so far             (1)
        m_i        <- root allocation over the candidate pool           (2)
        trees      <- m_i raw rollouts per chosen prompt                (3)
        K_ijt      <- prefix scores + prefix allocation                 (4)
        trees      <- K continuations from each chosen prefix           (5)
        r, A       <- verified rewards, subtree means, advantages       (6)
        policy     <- clipped-surrogate update on the trees             (7)

With ``run.max_staleness`` S > 0, (1)-(6) of iteration i + 1 run while (7) of iteration i trains,
on the weights of version max(0, i + 1 - S) (``flows.pipeline``); S = 0 is the loop below.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect import tags as prefect_tags

from flows.ending import IterationEnd, eval_plan
from flows.pipeline import pipelined_iterations, rollout_stages
from tasks.artifacts import (
    iteration_tag,
    name_flow_run,
    prefect_link_tags,
    publish_mlflow_link,
    run_tags,
    tag_flow_run,
)
from tasks.stages import StageRunner, stage_tasks
from trace_core.allocation.strategies import for_strategy, foreign_settings
from trace_core.analysis.outcome import paired_change, uniform_effective_ratio
from trace_core.config import TrainConfig, load_train_config
from trace_core.config.io import config_hash
from trace_core.home.lock import hold_run_lock
from trace_core.home.run_row import recording_run
from trace_core.runtime import Runtime
from trace_core.stages.results import Evaluation, IterationResults
from trace_core.stages.run import RunRef, check_run_id, initial_checkpoint, new_run_id
from trace_core.store import ensure_catalog
from tracking.run_tracker import RunTracker


def eval_result(ev: Evaluation) -> str:
    if ev.accuracy is None:
        return "off (run.eval_tasks = 0)"
    return f"{ev.accuracy:.1%} over {ev.episodes} episodes in {ev.seconds:.1f} s"


def run_name() -> str:
    """The flow run's name in the Prefect UI: the run id, the same on every resume. Without one,
    the id is made here, before the flow starts, so that the logs and every task run carry it from
    the first line; the flow then takes its run id from this name (``named_run_id``)."""
    from prefect.runtime import flow_run

    params = flow_run.get_parameters()
    if params.get("run_id"):
        return params["run_id"]
    config = params.get("config")
    if isinstance(config, TrainConfig):
        return new_run_id(config)
    allocation = config.get("allocation") if isinstance(config, dict) else None
    return new_run_id((allocation or {}).get("strategy") or "run")


def named_run_id() -> str | None:
    """The run id ``run_name`` gave this flow run (None outside a flow run, or for a name that is
    not a run id)."""
    from prefect.runtime import flow_run


    name = flow_run.get_name()
    try:
        return check_run_id(name) if name else None
    except ValueError:
        return None


@flow(name="trace-train", log_prints=True, flow_run_name=run_name)
def train_flow(config: TrainConfig, run_id: str | None = None, home: str = ".trace-home",
               tracking_uri: str | None = None, parent_tracking_run: str | None = None) -> dict:
    """Train the policy in ``config`` for ``run.iterations`` iterations. The same ``run_id``
    after a crash resumes from the last finished stage."""
    cfg = TrainConfig.model_validate(config)
    ignored = foreign_settings(cfg.allocation)  # settings per strategy: the run keeps only its strategy's
    cfg = cfg.model_copy(update={"allocation": for_strategy(cfg.allocation, cfg.allocation.strategy)})
    ref = RunRef(str(Path(home).resolve()), run_id or named_run_id() or new_run_id(cfg.allocation.strategy))
    if run_id is None:
        name_flow_run(ref.run_id)  # a no-op when run_name made the id
    with hold_run_lock(ref.run_dir), recording_run(  # one writer per run; the run's row in the `runs` view
            ref.home, ref.run_id, cfg, strategy=cfg.allocation.strategy, seed=cfg.run.seed,
            parent_run_id=parent_tracking_run), Runtime(cfg) as rt:  # a compare child names its comparison
        t = stage_tasks(ref.home, timeout=cfg.run.stage_timeout_s)
        log = get_run_logger()
        log.info("run %s  strategy=%s  config=%s  home=%s", ref.run_id, cfg.allocation.strategy, config_hash(cfg), ref.home)
        if ignored:
            log.info("allocation settings %s are not read by %s: left at their defaults in this run",
                     ", ".join(f"{k}={v!r}" for k, v in ignored.items()), cfg.allocation.strategy)
        tags = run_tags(ref.run_id, cfg)  # on the flow run and every task run, filterable in the UI
        tag_flow_run(tags)
        tracker = RunTracker(ref, cfg, tracking_uri=tracking_uri, parent=parent_tracking_run,
                             tags=prefect_link_tags())
        ensure_catalog(ref.home)  # DIR/trace.duckdb: analysts can query while training writes shards

        checkpoint = initial_checkpoint(cfg)
        log.info("held-out evaluation before training: %s", eval_plan(cfg))
        with prefect_tags(*tags):
            accuracy = before = t.evaluate(cfg, checkpoint, rt)  # its per-cell outcomes: the predictor's first prior
        log.info("held-out accuracy before training: %s", eval_result(before))
        tracker.log_evaluation(accuracy, trained=0)
        publish_mlflow_link(ref.run_id, tracker.mlflow_link())  # the MLflow run, from the Prefect UI
        end = IterationEnd(t, ref, cfg, rt, tracker, log, before, accuracy)  # evaluate, record, track, retire
        run = StageRunner(log, ref.home)  # a cached stage whose shard or checkpoint is gone is recomputed
        if cfg.run.max_staleness:  # rollouts of the next iterations while this one's update trains
            checkpoint = pipelined_iterations(t, ref, cfg, rt, run, end, tags, checkpoint)
        else:
            for i in range(cfg.run.iterations):
                t_iter = time.perf_counter()
                run.next_iteration(tags=[*tags, iteration_tag(i)])
                predictor, roots, raw, prefixes, extensions, verified = rollout_stages(          # (1)-(6)
                    t, ref, cfg, i, before, checkpoint, rt, run)
                update = run(t.update_policy, ref, cfg, i, checkpoint, verified, rt)                   # (7)
                checkpoint = update.checkpoint
                end(run, i, IterationResults(predictor=predictor, roots=roots, raw=raw, prefixes=prefixes,
                                             extensions=extensions, verified=verified, update=update), t_iter)
        history, timings, accuracy = end.history, end.timings, end.accuracy
        ensure_catalog(ref.home)  # current again if a damaged shard was left out at the start
        report = tracker.finish(history, checkpoint=checkpoint)
        return {"run_id": ref.run_id, "home": ref.home, "checkpoint": checkpoint, "iterations": history,
                "timings": timings, "report": report, "recomputed": run.recomputed,
                "accuracy_before": before.accuracy, "mlflow": tracker.mlflow_link(),
                "accuracy_change": paired_change(before, accuracy), "eval_samples": cfg.run.eval_samples,
                "group_size": cfg.allocation.group_size,
                "uniform_effective_ratio": uniform_effective_ratio(ref, history, cfg.allocation.group_size),
                "report_path": str(ref.artifacts_dir / "report.md")}


@flow(name="trace-train-scheduled", log_prints=True, flow_run_name=run_name)
def scheduled_train(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None,
                    run_id: str | None = None, home: str = ".trace-home", tracking_uri: str | None = None) -> dict:
    """Entry point of the scheduled deployment (``prefect.yaml``): load a YAML config from the
    worker's checkout, apply ``overrides``, and run the training flow as a subflow."""
    cfg = load_train_config(config_path, overrides or [])
    if run_id is None:  # named now, so that the training subflow carries the same name
        run_id = new_run_id(cfg.allocation.strategy)
        name_flow_run(run_id)
    return train_flow(cfg, run_id=run_id, home=home, tracking_uri=tracking_uri)
