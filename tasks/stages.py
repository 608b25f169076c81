"""Thin Prefect tasks, one per stage of a TRACE iteration, each calling one function of
``trace_core.stages.iteration`` and returning its frozen record.

Caching is keyed on the task's inputs and source and the ``trace_core`` source digest (run id,
iteration, config, checkpoint, upstream records; ``tasks.cache.PackageSource``), never on the
flow-run id, so the same command with the same ``--run-id`` after a crash replays every finished
stage from the cache and recomputes only the rest, and an edited stage recomputes. Results are
persisted as JSON under ``home/prefect-results`` and read back only through
``tasks.cache.JsonOnlyKeyStorage`` (never unpickled, whatever a planted record declares).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass, fields
from logging import Logger, LoggerAdapter
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.cache_policies import TASK_SOURCE
from prefect.task_engine import TaskRunTimeoutError

from tasks.cache import JsonOnlyKeyStorage, PackageSource, PortableInputs, rebase
from trace_core.stages import iteration as it
from trace_core.stages.results import broken_output

# Engine faults (CUDA OOM, a lost NCCL peer, a dropped connection) are worth one more try; bugs
# are not: ``retry_transient`` decides, per failure.
ENGINE_RETRIES = 2

# errno values of I/O that may succeed when tried again (busy, interrupted, a flaky device or link)
TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.EIO, errno.ETIMEDOUT,
                              errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.EPIPE,
                              errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ESTALE})
# RuntimeError messages of accelerator / collective faults; a device-side assert or an illegal
# memory access is a bug (and poisons the CUDA context), never retried
_TRANSIENT_MESSAGE = re.compile(r"out of memory|CUDA error|NCCL|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)
_BUG_MESSAGE = re.compile(r"device-side assert|illegal memory access|illegal instruction", re.IGNORECASE)


def is_transient(exc: BaseException | None) -> bool:
    """Whether a stage that raised ``exc`` may succeed when run again unchanged.

    Transient: CUDA out-of-memory, a RuntimeError naming a CUDA / NCCL / out-of-memory fault,
    ConnectionError, TimeoutError, an OSError whose errno is in ``TRANSIENT_ERRNOS``, or any
    of these as the explicit ``__cause__`` of what was raised. Not transient: everything else,
    in particular programming and data errors (TypeError, ValueError, KeyError, AssertionError,
    a missing file) and a stage's own ``timeout_seconds`` running out (the abandoned attempt may
    still hold the engine; the timeout is the operator's limit, not a fault to repeat).
    """
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, TaskRunTimeoutError):
            return False
        if _transient_here(exc):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def _transient_here(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, OSError):
        return exc.errno in TRANSIENT_ERRNOS
    if type(exc) is RuntimeError or type(exc).__name__ in {"AcceleratorError", "DistBackendError"}:
        msg = str(exc)
        return bool(_TRANSIENT_MESSAGE.search(msg)) and not _BUG_MESSAGE.search(msg)
    return False


def retry_transient(task: Task, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry the failed run in ``state`` only for a transient fault."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_transient(exc)


_ENGINE = {"retries": ENGINE_RETRIES, "retry_delay_seconds": 5, "retry_condition_fn": retry_transient}


@dataclass(frozen=True)
class StageTasks:
    """The stage tasks of one run home, in flow order (results and cache keys stored there)."""

    refresh_predictor: Task
    allocate_roots: Task
    generate_raw_rollouts: Task
    score_prefixes: Task
    extend_and_refill: Task
    verify_rewards: Task
    update_policy: Task
    evaluate: Task
    record_iteration: Task


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    return flow_run.get_name() or "run"


def stage_run_name(stage: str, parameters: dict[str, Any]) -> str:
    """What the Prefect UI calls a stage's task run: stage, run id and iteration
    (``generate-raw-rollouts r1 iter 3``), the same on every resume of the run id. ``evaluate``
    names the checkpoint it scores: ``evaluate r1 after iter 3`` or ``evaluate r1 before training``."""
    if stage == "evaluate":
        ckpt = Path(str(parameters.get("checkpoint", "")))
        if ckpt.parent.name == "checkpoints" and ckpt.name.startswith("iter="):
            return f"evaluate {ckpt.parents[1].name} after iter {int(ckpt.name[5:])}"
        return f"evaluate {_flow_run_name()} before training"
    ref = parameters.get("ref")
    return f"{stage} {getattr(ref, 'run_id', None) or _flow_run_name()} iter {parameters.get('iteration')}"


def _stage(fn: Any, name: str, **options: Any) -> Task:
    def run_name(parameters: dict[str, Any]) -> str:
        return stage_run_name(name, parameters)

    return task(fn, name=name, task_run_name=run_name, **options)


_TASKS = StageTasks(
    refresh_predictor=_stage(it.refresh_predictor, "refresh-predictor"),
    allocate_roots=_stage(it.allocate_roots, "allocate-roots"),
    generate_raw_rollouts=_stage(it.generate_raw_rollouts, "generate-raw-rollouts", **_ENGINE),
    score_prefixes=_stage(it.score_prefixes, "score-prefixes"),
    extend_and_refill=_stage(it.extend_and_refill, "extend-and-refill", **_ENGINE),
    verify_rewards=_stage(it.verify_rewards, "verify-rewards"),
    update_policy=_stage(it.update_policy, "update-policy", **_ENGINE),
    evaluate=_stage(it.evaluate, "evaluate"),
    record_iteration=_stage(it.record_iteration, "record-iteration"),
)


# stages that run the engine or the trainer and can hang on a wedged device or collective
TIMED_STAGES = frozenset({"generate_raw_rollouts", "extend_and_refill", "update_policy"})


def stage_tasks(home: str | Path, timeout: float | None = None) -> StageTasks:
    """The stage tasks with results and cache records persisted under ``home`` (resume after a
    crash needs both on disk; the key is inputs + task source, not the flow run).

    ``timeout``: seconds a generation or update stage may run before it fails (``run.stage_timeout_s``;
    None = no limit). A timed-out stage is not retried.
    """
    root = Path(home).resolve() / "prefect-results"
    policy = (PortableInputs(home=str(Path(home).resolve())) + TASK_SOURCE + PackageSource()).configure(
        key_storage=JsonOnlyKeyStorage(basepath=str(root / "keys"), values_basepath=str(root / "values")))
    storage = root / "values"  # a Path: a local file system, no server-side block needed
    options = {"cache_policy": policy, "persist_result": True, "result_storage": storage, "result_serializer": "json"}
    return StageTasks(**{f.name: getattr(_TASKS, f.name).with_options(
        **options, **({"timeout_seconds": timeout} if f.name in TIMED_STAGES and timeout else {}))
        for f in fields(StageTasks)})


class StageRunner:
    """Calls stage tasks, replaying a cached record only while what it points at is on disk.

    A replayed record whose shard or checkpoint is missing or does not open (deleted, truncated
    after the run) is named in the log and its stage recomputed (``refresh_cache``), and so is
    every later stage of that iteration: they consumed the lost output. ``next_iteration``
    starts the next iteration with the cache trusted again.
    """

    def __init__(self, log: Logger | LoggerAdapter, home: str | Path | None = None):
        self.log = log
        self.home = home  # replayed records written under another home are re-rooted here
        self.refreshing = False
        self.recomputed: list[str] = []  # one line per stage recomputed for a lost output
        self.tags: list[str] = []  # Prefect tags of the task runs (run, strategy, config, iteration)

    def next_iteration(self, tags: list[str] | None = None) -> None:
        self.refreshing = False
        self.tags = list(tags or [])

    def __call__(self, task: Task, *args: Any) -> Any:
        if self.tags:  # tags are not part of the cache key: a resume still replays
            task = task.with_options(tags=set(self.tags))
        if self.refreshing:
            return task.with_options(refresh_cache=True)(*args)
        record = task(*args)
        if self.home is not None:
            record = rebase(record, self.home)
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
