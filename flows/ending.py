"""The end of an iteration, the same in the synchronous and the pipelined flow: held-out
evaluation when due, the iteration's row, the Prefect artifacts, MLflow, checkpoint retention."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from logging import Logger, LoggerAdapter
from typing import Any

from tasks.artifacts import publish_iteration
from tasks.stages import StageRunner, StageTasks
from trace_core.config import TrainConfig
from trace_core.policy.checkpoint import retire_checkpoints
from trace_core.runtime import Runtime
from trace_core.stages.results import Evaluation, IterationResults, IterationTiming
from trace_core.stages.run import RunRef
from tracking.run_tracker import RunTracker, wall_metrics


def eval_plan(cfg: TrainConfig) -> str:
    return f"{cfg.run.eval_tasks} prompts x {cfg.run.eval_samples} samples"


def overhead_split(results: IterationResults, accuracy: Evaluation, wall: float) -> IterationTiming:
    """Seconds per stage (work inside the tasks, shard writes included) and what is left of the
    iteration's wall time: orchestration (Prefect), tracking and artifacts."""
    return IterationTiming(stages=results.stage_seconds(), evaluate_s=accuracy.seconds, iteration_s=wall)


@dataclass
class IterationEnd:
    """What every iteration ends with, and the run's history of it (the ``iterations`` rows and
    this process's wall-time splits)."""

    t: StageTasks
    ref: RunRef
    cfg: TrainConfig
    rt: Runtime
    tracker: RunTracker
    log: Logger | LoggerAdapter
    before: Evaluation  # the held-out evaluation before training
    accuracy: Evaluation = field(default_factory=Evaluation)  # the latest evaluation
    history: list[dict] = field(default_factory=list)
    timings: list[IterationTiming] = field(default_factory=list)

    def __call__(self, run: StageRunner, i: int, results: IterationResults, t_iter: float,
                 keep_extra: int = 0) -> dict[str, Any]:
        """Evaluate (when due), record, publish and track iteration ``i``; retire old checkpoints
        (``keep_extra`` more than ``run.keep_checkpoints``: those the pipeline still samples with)."""
        cfg, checkpoint = self.cfg, results.update.checkpoint
        last = i == cfg.run.iterations - 1
        due = last or (cfg.run.eval_every and (i + 1) % cfg.run.eval_every == 0)
        if due:
            self.log.info("held-out evaluation after iter %d: %s", i, eval_plan(cfg))
        accuracy = self.accuracy = run(self.t.evaluate, cfg, checkpoint, self.rt) if due else Evaluation()
        row = run(self.t.record_iteration, self.ref, cfg, i, results, accuracy, self.before if i == 0 else None)
        publish_iteration(self.ref, cfg, i, results, row)
        self.tracker.log_iteration(i, results, row)  # step = iteration, as in the store
        self.tracker.log_evaluation(accuracy, trained=i + 1)
        timing = overhead_split(results, accuracy, time.perf_counter() - t_iter)
        self.tracker.log(wall_metrics(timing), step=i, group="wall")
        self.history.append(row)
        self.timings.append(timing)
        scored = {r["iteration"]: r.get("accuracy") for r in self.history}  # retention: newest N + best
        keep = cfg.run.keep_checkpoints + keep_extra if cfg.run.keep_checkpoints else None
        retire_checkpoints(self.ref.run_dir / "checkpoints", scored, keep, cfg.run.keep_best_checkpoint, newest=i)
        return row
