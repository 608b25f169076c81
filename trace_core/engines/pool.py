"""A pool of rollout workers on Ray: each worker is an actor holding one engine (hf or vllm), the
environments and the live policy, possibly in its own Python environment (the vLLM worker env).

The raw-rollout, extension and evaluation stages shard their episodes over the workers::

    pool = RolloutPool(cfg)                  # N actors (run.rollout_workers), local Ray or ray.address
    nodes = pool.raw(checkpoint, tasks, counts, sampling=..., cfg=..., seed=..., run_id=..., iteration=...)
    pool.close()

Sharding keeps results independent of the number of workers: every sample's seed comes from its
(prompt, path, depth) (``rollout._request_seed``, ``engines.base.sample_seed``), and the episodes
that may share an engine request (same prompt text) always go to the same shard, in the same
order. Shard outputs are put back in the order the in-process path writes them, so the node
table is the same with 0, 1 or N workers. A worker reloads weights only when the checkpoint
changes (from the path, which every worker must be able to read: shared or object storage).

Faults: a shard whose actor dies (``RayActorError``) is queued again and runs on the next free
worker; the dead actor is replaced by a fresh one (at most ``ray.max_restarts`` times a stage).
Nothing is lost and nothing duplicated: a shard's result is kept only from the call that returned it.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field


class RayConfig(BaseModel):
    """Where the rollout workers run (used when ``run.rollout_workers >= 1``)."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None, description="Ray cluster to join ('auto', 'ray://host:10001', 'host:6379'); None = $RAY_ADDRESS if "
        "set, else a local Ray started for the run (ray.init(num_cpus=...)) and shut down after it.")
    num_cpus: int | None = Field(None, ge=1, le=100_000,
                                 description="CPUs of the local Ray (None = max(rollout_workers, os.cpu_count())).")
    cpus_per_worker: float = Field(1.0, ge=0.0, le=1024, description="Ray CPUs each rollout actor reserves.")
    gpus_per_worker: float = Field(0.0, ge=0.0, le=16, description="Ray GPUs each rollout actor reserves (GPU pool: 1).")
    worker_threads: int = Field(1, ge=1, le=1024, description="torch.set_num_threads in each actor (1 per CPU).")
    worker_python: str | None = Field(
        None, description="Interpreter of the workers' own environment (runtime_env py_executable), e.g. "
        "<vllm env>/bin/python; None = the driver's. It needs trace_core and the same Ray version.")
    env_vars: dict[str, str] = Field(default_factory=dict, description="Environment variables of the workers.")
    max_restarts: int = Field(3, ge=0, le=100, description="Dead actors replaced per stage before the stage fails.")
    shards_per_worker: int = Field(
        4, ge=1, le=1024,
        description="Shards a stage is cut into per worker (with >= 2 workers); a worker takes the next one when "
        "it is done, so episodes of unequal length even out (1 = one big batch each, least per-batch cost).")
    start_timeout_s: float = Field(
        600.0, gt=0, description="Seconds the workers may take to start (a cluster without the CPUs/GPUs they "
        "reserve would otherwise wait forever).")


# ----------------------------------------------------------------------------- sharding
def shard_groups(keys: Sequence[str], weights: Sequence[int], shards: int) -> list[list[int]]:
    """Indices ``0..len(keys)-1`` split into at most ``shards`` lists: equal keys stay together,
    groups go heaviest first to the lightest shard (ties: the lower shard), each list ascending."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    load, out = [0] * shards, [[] for _ in range(shards)]
    for idx in sorted(groups.values(), key=lambda g: (-sum(int(weights[i]) for i in g), g[0])):
        s = int(np.argmin(load))
        out[s] += idx
        load[s] += sum(int(weights[i]) for i in idx)
    return [sorted(s) for s in out if s]


def _empty_raw() -> dict[str, Any]:
    """A raw-rollout shard with no prompt (the in-process result of an empty allocation)."""
    return {"tasks": [], "counts": [], "v_pred": None, "utility": None}


def _ordered(frames: list[pl.DataFrame], rank: Mapping[str, int], key: pl.Expr) -> pl.DataFrame:
    """Shard frames concatenated and put in the in-process order: by ``rank[key]``, then by row
    position within its shard (a shard keeps the relative order of the episodes it got)."""
    parts = [f.with_columns(pl.int_range(pl.len()).alias("_pos")) for f in frames if f.height]
    if not parts:
        return frames[0]
    both = pl.concat(parts, how="vertical_relaxed")
    ranks = pl.DataFrame({"_key": list(rank), "_rank": list(rank.values())}, schema={"_key": pl.Utf8, "_rank": pl.Int64})
    both = both.with_columns(key.alias("_key")).join(ranks, on="_key", how="left", maintain_order="left")
    return both.sort("_rank", "_pos", maintain_order=True).drop("_pos", "_key", "_rank")


# ----------------------------------------------------------------------------- the actor
class RolloutWorker:
    """One rollout worker (a Ray actor): the policy at the last checkpoint it was asked for, its
    engine and the environments, all built in the worker's own process."""

    def __init__(self, cfg_json: str, threads: int) -> None:
        import torch

        from trace_core.config import TrainConfig
        from trace_core.iteration import environments

        torch.set_num_threads(threads)
        self.cfg = TrainConfig.model_validate_json(cfg_json)
        self.cfg.run.threads = threads
        self.envs = environments(self.cfg)  # the flow's own (data files: a path every worker reads)
        self.loaded: list[str] = []  # checkpoints in the order this worker loaded them

    def pid(self) -> int:
        return os.getpid()

    def checkpoints(self) -> list[str]:
        return list(self.loaded)

    def run(self, checkpoint: str, kind: str, kwargs: dict[str, Any]) -> Any:
        """``kind`` in raw / extend / eval: the in-process rollout function on this worker's engine."""
        from trace_core.policy.live import rollouts_here

        if not self.loaded or self.loaded[-1] != checkpoint:
            self.loaded.append(checkpoint)
        return rollouts_here(self.cfg, checkpoint, kind, self.envs, **kwargs)


# ----------------------------------------------------------------------------- the pool
class RolloutPool:
    """``workers`` rollout actors; ``raw`` / ``extend`` / ``evaluate`` mirror ``trace_core.rollout``."""

    def __init__(self, cfg: Any, workers: int | None = None) -> None:
        import ray

        self.cfg, rc = cfg, cfg.ray
        self.size = int(workers or cfg.run.rollout_workers)
        if self.size < 1:
            raise ValueError(f"a rollout pool needs >= 1 worker, got {self.size}")
        self.actors: list[Any] = []
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            address = rc.address or os.environ.get("RAY_ADDRESS")
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=rc.num_cpus or max(self.size, os.cpu_count() or 1), include_dashboard=False,
                         log_to_driver=False)
        # spawn: a vLLM engine core started from an actor must not fork a process that runs Ray's threads
        env = {"OMP_NUM_THREADS": str(rc.worker_threads), "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        runtime_env: dict[str, Any] = {"env_vars": {**env, **rc.env_vars}}
        if rc.worker_python:
            runtime_env["py_executable"] = rc.worker_python
        self._actor_cls = ray.remote(RolloutWorker).options(
            num_cpus=rc.cpus_per_worker, num_gpus=rc.gpus_per_worker, runtime_env=runtime_env, max_restarts=0)
        self._cfg_json = cfg.model_copy(update={"run": cfg.run.model_copy(update={"rollout_workers": 0})}
                                        ).model_dump_json()
        self.actors = [self._start() for _ in range(self.size)]
        try:  # fail here, not mid-stage, if a worker cannot start
            ray.get([a.pid.remote() for a in self.actors], timeout=rc.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RuntimeError(f"{self.size} rollout workers did not start within ray.start_timeout_s="
                               f"{rc.start_timeout_s:g} s; each reserves {rc.cpus_per_worker:g} CPU and "
                               f"{rc.gpus_per_worker:g} GPU, the cluster has {ray.available_resources()}") from None
        self.restarts = 0
        self.last_stage: PoolStage | None = None
        self.shards = self.size * rc.shards_per_worker if self.size > 1 else 1  # one worker: one batch

    def _start(self) -> Any:
        return self._actor_cls.remote(self._cfg_json, self.cfg.ray.worker_threads)

    def close(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        if self.owns_ray:
            ray.shutdown()

    # -- dispatch ----------------------------------------------------------------------------
    def submit(self, checkpoint: str, kind: str, payloads: list[dict[str, Any]]) -> PoolStage:
        """Start a stage's shards; ``.collect()`` on the result waits for them (``last_stage`` too)."""
        self.last_stage = PoolStage(self, checkpoint, kind, payloads)
        return self.last_stage

    def _replace(self, dead: Any) -> Any:
        import ray

        self.restarts += 1
        if self.restarts > self.cfg.ray.max_restarts:
            raise RuntimeError(f"rollout workers died {self.restarts} times in one stage (ray.max_restarts="
                               f"{self.cfg.ray.max_restarts})")
        ray.kill(dead)
        fresh = self._start()
        self.actors[self.actors.index(dead)] = fresh
        return fresh

    # -- the stages ---------------------------------------------------------------------------
    def raw(self, checkpoint: str, tasks: Sequence[Any], counts: Sequence[int], *, v_pred: Sequence[float] | None = None,
            utility: Sequence[float] | None = None, **kwargs: Any) -> pl.DataFrame:
        """``rollout.run_rollouts`` sharded by prompt text; the same rows in the same order."""
        keep = [i for i, m in enumerate(counts) if m > 0]
        shards = shard_groups([tasks[i].question for i in keep], [counts[i] for i in keep], self.shards)
        payloads = []
        for s in shards:
            idx = [keep[j] for j in s]
            payloads.append({"tasks": [tasks[i] for i in idx], "counts": [int(counts[i]) for i in idx],
                             "v_pred": None if v_pred is None else [v_pred[i] for i in idx],
                             "utility": None if utility is None else [utility[i] for i in idx], **kwargs})
        frames = self.submit(checkpoint, "raw", payloads or [{**_empty_raw(), **kwargs}]).collect()
        # in-process order: every root first (prompt order), then each prompt's turn rows
        rank = {f"{kind}{tasks[i].prompt_id}": r + off for r, i in enumerate(keep)
                for kind, off in (("r:", 0), ("t:", len(keep)))}
        key = pl.concat_str(pl.when(pl.col("depth") == 0).then(pl.lit("r:")).otherwise(pl.lit("t:")), "prompt_id")
        return _ordered(frames, rank, key)

    def extend(self, checkpoint: str, tasks_by_prompt: Mapping[str, Any], nodes: pl.DataFrame,
               counts: Mapping[str, int], **kwargs: Any) -> pl.DataFrame:
        """``rollout.extend_prefixes`` sharded by prompt text; the same rows in the same order."""
        if not counts:
            from trace_core.tree import nodes_frame

            return nodes_frame([])
        prompt_of = dict(zip(nodes["node_id"].to_list(), nodes["prompt_id"].to_list(), strict=True))
        prefixes = list(counts)
        missing = [p for p in prefixes if p not in prompt_of]
        if missing:
            raise KeyError(f"prefix node {missing[0]} is not in the node table")
        keys = [tasks_by_prompt[prompt_of[p]].question for p in prefixes]
        payloads = []
        for s in shard_groups(keys, [counts[p] for p in prefixes], self.shards):
            mine = {prefixes[j]: counts[prefixes[j]] for j in s}
            prompts = {prompt_of[p] for p in mine}
            payloads.append({"tasks_by_prompt": {p: tasks_by_prompt[p] for p in prompts},
                             "nodes": nodes.filter(pl.col("prompt_id").is_in(sorted(prompts))), "counts": mine,
                             **kwargs})
        frames = self.submit(checkpoint, "extend", payloads).collect()
        # an episode's rows are contiguous in its shard; its first row's parent is the prefix
        first = pl.concat([f.select("trajectory_id", "parent_id") for f in frames if f.height] or [
            pl.DataFrame(schema={"trajectory_id": pl.Utf8, "parent_id": pl.Utf8})])
        prefix_of = dict(first.filter(pl.col("parent_id").is_in(prefixes)).iter_rows())
        order = {p: r for r, p in enumerate(prefixes)}
        rank = {t: order[p] for t, p in prefix_of.items()}
        return _ordered(frames, rank, pl.col("trajectory_id"))

    def evaluate(self, checkpoint: str, tasks: Sequence[Any], samples: int, **kwargs: Any) -> np.ndarray:
        """``rollout.evaluate_rewards`` sharded by prompt text: rewards ``(len(tasks), samples)``."""
        shards = shard_groups([t.question for t in tasks], [samples] * len(tasks), self.shards)
        parts = self.submit(checkpoint, "eval", [{"tasks": [tasks[i] for i in s], "samples": samples, **kwargs}
                                                 for s in shards]).collect()
        out = np.zeros((len(tasks), samples), dtype=float)
        for s, rewards in zip(shards, parts, strict=True):
            out[s] = rewards
        return out


class PoolStage:
    """Shards submitted to a pool: one per free worker, the rest queued; ``collect`` waits for all,
    re-queueing the shard of a worker that died (on a fresh actor or whichever worker is free first)."""

    def __init__(self, pool: RolloutPool, checkpoint: str, kind: str, payloads: list[dict[str, Any]]) -> None:
        self.pool, self.checkpoint, self.kind, self.payloads = pool, checkpoint, kind, payloads
        self.results: list[Any] = [None] * len(payloads)
        self.queue = deque(range(len(payloads)))
        self.running: dict[Any, tuple[int, Any]] = {}
        self.idle = list(pool.actors)
        pool.restarts = 0
        self._fill()

    def _fill(self) -> None:
        while self.queue and self.idle:
            actor, i = self.idle.pop(0), self.queue.popleft()
            self.running[actor.run.remote(self.checkpoint, self.kind, self.payloads[i])] = (i, actor)

    def collect(self) -> list[Any]:
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        while self.running:
            done, _ = ray.wait(list(self.running), num_returns=1)
            for ref in done:
                i, actor = self.running.pop(ref)
                try:
                    self.results[i] = ray.get(ref)
                    self.idle.append(actor)
                except (RayActorError, ActorDiedError, ActorUnavailableError):
                    self.queue.appendleft(i)  # its episodes run again, elsewhere; nothing was kept
                    self.idle.append(self.pool._replace(actor))
            self._fill()
        return self.results
