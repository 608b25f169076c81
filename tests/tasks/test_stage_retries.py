"""Stage retries and timeouts: the retry predicate on exceptions and Prefect
states, and ``run.stage_timeout_s`` applied to the generation and update tasks (no flow run)."""

from __future__ import annotations

import errno

import pytest
import torch
from prefect.states import Completed, Failed
from prefect.task_engine import TaskRunTimeoutError

from tasks.stages import ENGINE_RETRIES, TIMED_STAGES, is_transient, retry_transient, stage_tasks
from trace_core.config import load_train_config

TRANSIENT = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: out of memory"),
    RuntimeError("NCCL communicator was aborted on rank 1"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    ConnectionError("vLLM worker connection lost"),
    ConnectionResetError(errno.ECONNRESET, "reset by peer"),
    TimeoutError("collective timed out"),
    OSError(errno.EAGAIN, "Resource temporarily unavailable"),
    OSError(errno.EIO, "Input/output error"),
    BlockingIOError(errno.EAGAIN, "try again"),
]
BUGS = [
    TypeError("unsupported operand type(s)"),
    ValueError("checkpoint does not fit the model"),
    KeyError("prompt_id"),
    AssertionError(),
    IndexError("list index out of range"),
    AttributeError("'NoneType' object has no attribute 'model'"),
    ZeroDivisionError(),
    NotImplementedError(),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"),
    RuntimeError("CUDA error: device-side assert triggered"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    FileNotFoundError(errno.ENOENT, "no model.safetensors (or index) in runs/r/checkpoints/iter=00000"),
    PermissionError(errno.EACCES, "Permission denied"),
    OSError(errno.ENOSPC, "No space left on device"),
    TaskRunTimeoutError("Scope timed out after 30.0 second(s)."),  # the stage's own limit
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=repr)
def test_transient_faults_are_retried(exc):
    assert is_transient(exc)
    assert retry_transient(None, None, Failed(data=exc))


@pytest.mark.parametrize("exc", BUGS, ids=repr)
def test_programming_errors_are_not_retried(exc):
    assert not is_transient(exc)
    assert not retry_transient(None, None, Failed(data=exc))


def test_a_transient_cause_counts_a_bug_wrapper_does_not_hide_it():
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("generation failed for batch 3") from oom
    except RuntimeError as wrapped:
        assert is_transient(wrapped)
    assert not is_transient(ValueError("bad shard"))
    assert not retry_transient(None, None, Completed(data=3))  # no exception: nothing to retry


def test_stage_timeout_applies_to_generation_and_update_only(tmp_path):
    assert TIMED_STAGES == {"generate_raw_rollouts", "extend_and_refill", "update_policy"}
    t = stage_tasks(tmp_path, timeout=30)
    for name in TIMED_STAGES:
        task = getattr(t, name)
        assert task.timeout_seconds == 30.0
        assert task.retries == ENGINE_RETRIES and task.retry_condition_fn is retry_transient
    for name in ("refresh_predictor", "allocate_roots", "score_prefixes", "verify_rewards", "evaluate",
                 "record_iteration"):
        assert getattr(t, name).timeout_seconds is None
        assert getattr(t, name).retries == 0
    assert all(getattr(stage_tasks(tmp_path), n).timeout_seconds is None for n in TIMED_STAGES)


def test_stage_timeout_config_field():
    assert load_train_config(None).run.stage_timeout_s is None  # default: no limit
    assert load_train_config(None, ["run.stage_timeout_s=900"]).run.stage_timeout_s == 900.0
    with pytest.raises(Exception, match="stage_timeout_s"):
        load_train_config(None, ["run.stage_timeout_s=0"])
