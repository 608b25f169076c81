"""Thin Prefect tasks, one per stage of a TRACE iteration, each calling one function of
``trace_core.iteration`` and returning its frozen record.

Caching is keyed on the task's inputs and source and the ``trace_core`` source digest (run id,
iteration, config, checkpoint, upstream records; ``tasks.cache.PackageSource``), never on the
flow-run id, so the same command with the same ``--run-id`` after a crash replays every finished
stage from the cache and recomputes only the rest, and an edited stage recomputes. Results are
persisted as JSON under ``home/prefect-results`` and read back only through
``tasks.cache.JsonOnlyKeyStorage`` (never unpickled, whatever a planted record declares).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from logging import Logger, LoggerAdapter
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from tasks.cache import JsonOnlyKeyStorage, PackageSource
from trace_core import iteration as it
from trace_core.results import broken_output

# Engine faults (CUDA OOM, a vLLM worker restart) are worth one more try; bugs are not.
ENGINE_RETRIES = 2
_ENGINE = {"retries": ENGINE_RETRIES, "retry_delay_seconds": 5}


@dataclass(frozen=True)
class StageTasks:
    """The stage tasks of one run home, in flow order (results and cache keys stored there)."""

    refresh_predictor: Task
    allocate_roots: Task
    generate_raw_rollouts: Task
    score_prefixes: Task
    extend_prefixes: Task
    verify_rewards: Task
    update_policy: Task
    evaluate: Task
    record_iteration: Task


_TASKS = StageTasks(
    refresh_predictor=task(it.refresh_predictor, name="refresh-predictor"),
    allocate_roots=task(it.allocate_roots, name="allocate-roots"),
    generate_raw_rollouts=task(it.generate_raw_rollouts, name="generate-raw-rollouts", **_ENGINE),
    score_prefixes=task(it.score_prefixes, name="score-prefixes"),
    extend_prefixes=task(it.extend_prefixes, name="extend-prefixes", **_ENGINE),
    verify_rewards=task(it.verify_rewards, name="verify-rewards"),
    update_policy=task(it.update_policy, name="update-policy", **_ENGINE),
    evaluate=task(it.evaluate, name="evaluate"),
    record_iteration=task(it.record_iteration, name="record-iteration"),
)


def stage_tasks(home: str | Path) -> StageTasks:
    """The stage tasks with results and cache records persisted under ``home`` (resume after a
    crash needs both on disk; the key is inputs + task source, not the flow run)."""
    root = Path(home).resolve() / "prefect-results"
    policy = (INPUTS + TASK_SOURCE + PackageSource()).configure(
        key_storage=JsonOnlyKeyStorage(basepath=str(root / "keys"), values_basepath=str(root / "values")))
    storage = root / "values"  # a Path: a local file system, no server-side block needed
    return StageTasks(**{f.name: getattr(_TASKS, f.name).with_options(
        cache_policy=policy, persist_result=True, result_storage=storage, result_serializer="json")
        for f in fields(StageTasks)})


class StageRunner:
    """Calls stage tasks, replaying a cached record only while what it points at is on disk.

    A replayed record whose shard or checkpoint is missing or does not open (deleted, truncated
    after the run) is named in the log and its stage recomputed (``refresh_cache``), and so is
    every later stage of that iteration: they consumed the lost output. ``next_iteration``
    starts the next iteration with the cache trusted again.
    """

    def __init__(self, log: Logger | LoggerAdapter):
        self.log = log
        self.refreshing = False
        self.recomputed: list[str] = []  # one line per stage recomputed for a lost output

    def next_iteration(self) -> None:
        self.refreshing = False

    def __call__(self, task: Task, *args: Any) -> Any:
        if self.refreshing:
            return task.with_options(refresh_cache=True)(*args)
        record = task(*args)
        if (broken := broken_output(record)) is not None:
            path, why = broken
            line = f"{task.name}: output {path} is {why}; recomputing it and the iteration's later stages"
            self.log.warning(line)
            self.recomputed.append(line)
            self.refreshing = True
            record = task.with_options(refresh_cache=True)(*args)
            if (broken := broken_output(record)) is not None:
                raise RuntimeError(f"{task.name}: output {broken[0]} still {broken[1]} after recomputing")
        return record
