"""Thin Prefect tasks, one per stage of a TRACE iteration. Each reads references, calls one
``trace_core`` function and returns its small summary dict.

Caching is keyed on the task's inputs and source only (run id, iteration, config, checkpoint,
upstream references), never on the flow-run id, so the same command with the same ``--run-id``
after a crash replays every finished stage from the cache and recomputes only the rest.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from trace_core import stages, stages_learn
from trace_core.config import TrainConfig
from trace_core.runtime import RunRef

# Engine faults (CUDA OOM, a vLLM worker restart) are worth one more try; bugs are not.
ENGINE_RETRIES = 2


@task(name="refresh-predictor")
def refresh_predictor(ref: RunRef, cfg: TrainConfig, iteration: int) -> dict:
    return stages.refresh_predictor(ref, cfg, iteration)


@task(name="allocate-roots")
def allocate_roots(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: dict) -> dict:
    return stages.allocate_roots(ref, cfg, iteration, predictor)


@task(name="generate-raw-rollouts", retries=ENGINE_RETRIES, retry_delay_seconds=5)
def generate_raw(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, roots: dict) -> dict:
    return stages.generate_raw(ref, cfg, iteration, checkpoint, roots)


@task(name="score-prefixes")
def score_prefixes(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: dict, raw: dict, roots: dict) -> dict:
    return stages.score_prefixes(ref, cfg, iteration, predictor, raw, roots)


@task(name="extend-prefixes", retries=ENGINE_RETRIES, retry_delay_seconds=5)
def extend_prefixes(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, raw: dict, scored: dict) -> dict:
    return stages.extend(ref, cfg, iteration, checkpoint, raw, scored)


@task(name="verify-rewards")
def verify_rewards(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, predictor: dict, roots: dict,
                   raw: dict, scored: dict, ext: dict) -> dict:
    return stages_learn.verify(ref, cfg, iteration, checkpoint, predictor, roots, raw, scored, ext)


@task(name="update-policy", retries=ENGINE_RETRIES, retry_delay_seconds=5)
def update_policy(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, verified: dict) -> dict:
    return stages_learn.update(ref, cfg, iteration, checkpoint, verified)


@task(name="evaluate")
def evaluate(cfg: TrainConfig, checkpoint: str) -> dict:
    return stages_learn.evaluate(cfg, checkpoint)


@task(name="record-iteration")
def record_iteration(ref: RunRef, cfg: TrainConfig, iteration: int, results: dict, accuracy: dict) -> dict:
    return stages_learn.record_iteration(ref, cfg, iteration, results, accuracy)


STAGE_TASKS = (refresh_predictor, allocate_roots, generate_raw, score_prefixes, extend_prefixes, verify_rewards,
               update_policy, evaluate, record_iteration)


def cached(home: str | Path):
    """The stage tasks with results and cache records persisted under ``home`` (resume after a
    crash needs both on disk; the key is inputs + task source, not the flow run)."""
    root = Path(home).resolve() / "prefect-results"
    policy = (INPUTS + TASK_SOURCE).configure(key_storage=str(root / "keys"))
    storage = root / "values"  # a Path: a local file system, no server-side block needed
    return {t.name: t.with_options(cache_policy=policy, persist_result=True, result_storage=storage)
            for t in STAGE_TASKS}
