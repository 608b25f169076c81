"""The training flow: TRACE, one line a stage.

    for each iteration:
        predictor  <- refresh on every labelled node so far             (1)
        m_i        <- root allocation over the candidate pool           (2)
        trees      <- m_i raw rollouts per chosen prompt                (3)
        K_ijt      <- prefix scores + prefix allocation                 (4)
        trees      <- K continuations from each chosen prefix           (5)
        r, A       <- verified rewards, subtree means, advantages       (6)
        policy     <- clipped-surrogate update on the trees             (7)
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from prefect import flow, get_run_logger

from tasks.report import publish_iteration
from tasks.stages import cached
from tasks.track import RunTracker
from trace_core.config import TrainConfig
from trace_core.config_io import config_hash
from trace_core.runtime import RunRef, initial_checkpoint
from trace_core.store import ensure_catalog


def overhead_split(results: dict, accuracy: dict, wall: float) -> dict:
    """Seconds per stage (work inside the tasks, shard writes included) and what is left of the
    iteration's wall time: orchestration (Prefect), tracking and artifacts."""
    stages = {f"wall_{k}_s": float(v.get("seconds", 0.0)) for k, v in results.items()}
    stages["wall_evaluate_s"] = float(accuracy.get("seconds", 0.0)) if accuracy else 0.0
    work = sum(stages.values())
    return {**stages, "wall_iteration_s": wall, "wall_overhead_s": max(wall - work, 0.0),
            "wall_overhead_share": max(wall - work, 0.0) / wall if wall > 0 else 0.0}


def new_run_id(cfg: TrainConfig) -> str:
    return f"{cfg.allocation.strategy}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


@flow(name="trace-train", log_prints=True)
def train_flow(config: dict, run_id: str | None = None, home: str = ".trace-home",
               tracking_uri: str | None = None, parent_tracking_run: str | None = None) -> dict:
    """Train the policy in ``config`` (a ``TrainConfig`` as a dict) for ``run.iterations``
    iterations. The same ``run_id`` after a crash resumes from the last finished stage."""
    cfg = TrainConfig.model_validate(config)
    ref = RunRef(str(Path(home).resolve()), run_id or new_run_id(cfg))
    t = cached(ref.home)
    log = get_run_logger()
    log.info("run %s  strategy=%s  config=%s  home=%s", ref.run_id, cfg.allocation.strategy, config_hash(cfg), ref.home)
    tracker = RunTracker(ref, cfg, tracking_uri=tracking_uri, parent=parent_tracking_run)
    ensure_catalog(ref.home)  # DIR/trace.duckdb: analysts can query while training writes shards

    checkpoint = initial_checkpoint(cfg)
    accuracy = t["evaluate"](cfg, checkpoint)
    tracker.log(accuracy, step=0)
    history = []
    for i in range(cfg.run.iterations):
        t_iter = time.perf_counter()
        predictor = t["refresh-predictor"](ref, cfg, i)                                  # (1)
        roots = t["allocate-roots"](ref, cfg, i, predictor)                              # (2)
        raw = t["generate-raw-rollouts"](ref, cfg, i, checkpoint, roots)                 # (3)
        scored = t["score-prefixes"](ref, cfg, i, predictor, raw, roots)                 # (4)
        ext = t["extend-prefixes"](ref, cfg, i, checkpoint, raw, scored)                 # (5)
        verified = t["verify-rewards"](ref, cfg, i, checkpoint, predictor, roots, raw, scored, ext)  # (6)
        upd = t["update-policy"](ref, cfg, i, checkpoint, verified)                     # (7)
        checkpoint = upd["checkpoint"]

        last = i == cfg.run.iterations - 1
        due = last or (cfg.run.eval_every and (i + 1) % cfg.run.eval_every == 0)
        accuracy = t["evaluate"](cfg, checkpoint) if due else {}
        results = {"predictor": predictor, "roots": roots, "raw": raw, "score": scored, "extend": ext,
                   "verify": verified, "update": upd}
        row = t["record-iteration"](ref, cfg, i, results, accuracy)
        publish_iteration(ref, cfg, i, results, row)
        tracker.log_iteration(i, results, row)
        row = {**row, **overhead_split(results, accuracy, time.perf_counter() - t_iter)}
        tracker.log({k: v for k, v in row.items() if k.startswith("wall_")}, step=i + 1, force=True)
        history.append(row)
    report = tracker.finish(history)
    return {"run_id": ref.run_id, "home": ref.home, "checkpoint": checkpoint, "iterations": history, "report": report}


@flow(name="trace-train-scheduled", log_prints=True)
def scheduled_train(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None,
                    run_id: str | None = None, home: str = ".trace-home", tracking_uri: str | None = None) -> dict:
    """Entry point of the scheduled deployment (``prefect.yaml``): load a YAML config from the
    worker's checkout, apply ``overrides``, and run the training flow as a subflow."""
    from trace_core.config import load_train_config

    cfg = load_train_config(config_path, overrides or [])
    return train_flow(cfg.model_dump(mode="json"), run_id=run_id, home=home, tracking_uri=tracking_uri)
