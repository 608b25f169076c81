"""The Ray implementation of ``trace_core.rollout.interface.Rollouts``: a pool of rollout workers, each an
actor holding a ``LocalRollouts`` (engine ``run.engine``, the environments and the live policy),
possibly in its own Python environment (the vLLM worker env).

The raw-rollout, extension and evaluation stages shard their episodes over the workers::

    pool = RolloutPool(cfg)                  # N actors (run.rollout_workers), local Ray or ray.address
    nodes = pool.raw(checkpoint, tasks, counts, sampling=..., cfg=..., seed=..., run_id=..., iteration=...)
    pool.close()

The run's runtime holds it (``trace_core.runtime``); a worker is given its engine name and torch
threads as arguments and never reads them from (or writes them into) the config.

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

import contextlib
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from trace_core.config import TrainConfig
from trace_core.engines.config import SamplingConfig
from trace_core.envs.base import Task
from trace_core.envs.datasets import build_environments
from trace_core.nodes import nodes_frame
from trace_core.rollout.agent_loop import RolloutConfig
from trace_core.rollout.local import LocalRollouts


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
    """One rollout worker (a Ray actor): a ``LocalRollouts`` with ``engine`` and torch on
    ``threads`` threads, over the policy at the last checkpoint it was asked for and the
    environments, all built in the worker's own process."""

    def __init__(self, cfg_json: str, engine: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        cfg = TrainConfig.model_validate_json(cfg_json)
        # the flow's own environments (data files: a path every worker reads)
        self.local = LocalRollouts.for_config(cfg, build_environments(cfg.env, cfg.data), engine=engine,
                                              threads=threads)
        self.loaded: list[str] = []  # checkpoints in the order this worker loaded them

    def pid(self) -> int:
        return os.getpid()

    def checkpoints(self) -> list[str]:
        return list(self.loaded)

    def _follow(self, checkpoint: str) -> None:
        if not self.loaded or self.loaded[-1] != checkpoint:
            self.loaded.append(checkpoint)

    def raw(self, checkpoint: str, **kwargs: Any) -> pl.DataFrame:
        self._follow(checkpoint)
        return self.local.raw(checkpoint, **kwargs)

    def extend(self, checkpoint: str, **kwargs: Any) -> pl.DataFrame:
        self._follow(checkpoint)
        return self.local.extend(checkpoint, **kwargs)

    def evaluate(self, checkpoint: str, **kwargs: Any) -> np.ndarray:
        self._follow(checkpoint)
        return self.local.evaluate(checkpoint, **kwargs)


# ----------------------------------------------------------------------------- the pool
@contextlib.contextmanager
def _ray_outside_the_job() -> Iterator[None]:
    """While Ray starts: the processes of a local Ray (GCS, raylet and the workers they fork) go
    in a process group of their own, so a signal to the job's group (Ctrl-C, a scheduler's
    SIGTERM) reaches only the driver, which stops them itself (``ray.shutdown``), instead of Ray
    aborting the driver when its raylet dies first; they still die with the driver (Ray's
    parent-death signal). ``ray.init`` also sets SIGTERM to ``sys.exit``: the command's own
    handlers are put back."""
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    from ray._private import services

    base = getattr(services, "ConsolePopen", None)
    if base is not None:
        class OwnGroup(base):  # Popen(process_group=0): setpgid(0, 0) in the child
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("process_group", 0)
                super().__init__(*args, **kwargs)

        services.ConsolePopen = OwnGroup
    try:
        yield
    finally:
        if base is not None:
            services.ConsolePopen = base
        for s, h in handlers.items():
            if h is not None:
                signal.signal(s, h)


class RolloutPool:
    """``workers`` rollout actors (default ``run.rollout_workers``), each on engine ``run.engine``
    with ``ray.worker_threads`` threads; ``raw`` / ``extend`` / ``evaluate`` as ``rollouts.Rollouts``."""

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
            with _ray_outside_the_job():
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
        self._cfg_json = cfg.model_dump_json()
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
        return self._actor_cls.remote(self._cfg_json, self.cfg.run.engine, self.cfg.ray.worker_threads)

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
    def submit(self, call: Callable[[Any, dict[str, Any]], Any], payloads: list[dict[str, Any]]) -> PoolStage:
        """Start a stage's shards, ``call(actor, payload)`` each (it returns the actor call's ref);
        ``.collect()`` on the result waits for them (``last_stage`` too)."""
        self.last_stage = PoolStage(self, call, payloads)
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
    def raw(self, checkpoint: str, tasks: Sequence[Task], counts: Sequence[int], *, sampling: SamplingConfig,
            cfg: RolloutConfig, seed: int, run_id: str, iteration: int, strategy: str = "uniform",
            v_pred: Sequence[float] | None = None, utility: Sequence[float] | None = None) -> pl.DataFrame:
        """``rollout.run_rollouts`` sharded by prompt text; the same rows in the same order."""
        common = {"sampling": sampling, "cfg": cfg, "seed": seed, "run_id": run_id, "iteration": iteration,
                  "strategy": strategy}
        keep = [i for i, m in enumerate(counts) if m > 0]
        shards = shard_groups([tasks[i].question for i in keep], [counts[i] for i in keep], self.shards)
        payloads = []
        for s in shards:
            idx = [keep[j] for j in s]
            payloads.append({"tasks": [tasks[i] for i in idx], "counts": [int(counts[i]) for i in idx],
                             "v_pred": None if v_pred is None else [v_pred[i] for i in idx],
                             "utility": None if utility is None else [utility[i] for i in idx], **common})
        # no prompt chosen: one empty shard (the in-process result of an empty allocation)
        payloads = payloads or [{"tasks": [], "counts": [], "v_pred": None, "utility": None, **common}]
        frames = self.submit(lambda a, p: a.raw.remote(checkpoint, **p), payloads).collect()
        # in-process order: every root first (prompt order), then each prompt's turn rows
        rank = {f"{kind}{tasks[i].prompt_id}": r + off for r, i in enumerate(keep)
                for kind, off in (("r:", 0), ("t:", len(keep)))}
        key = pl.concat_str(pl.when(pl.col("depth") == 0).then(pl.lit("r:")).otherwise(pl.lit("t:")), "prompt_id")
        return _ordered(frames, rank, key)

    def extend(self, checkpoint: str, tasks_by_prompt: Mapping[str, Task], nodes: pl.DataFrame,
               counts: Mapping[str, int], *, sampling: SamplingConfig, cfg: RolloutConfig,
               seed: int) -> pl.DataFrame:
        """``rollout.extend_prefixes`` sharded by prompt text; the same rows in the same order."""
        if not counts:

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
                             "sampling": sampling, "cfg": cfg, "seed": seed})
        frames = self.submit(lambda a, p: a.extend.remote(checkpoint, **p), payloads).collect()
        # an episode's rows are contiguous in its shard; its first row's parent is the prefix
        first = pl.concat([f.select("trajectory_id", "parent_id") for f in frames if f.height] or [
            pl.DataFrame(schema={"trajectory_id": pl.Utf8, "parent_id": pl.Utf8})])
        prefix_of = dict(first.filter(pl.col("parent_id").is_in(prefixes)).iter_rows())
        order = {p: r for r, p in enumerate(prefixes)}
        rank = {t: order[p] for t, p in prefix_of.items()}
        return _ordered(frames, rank, pl.col("trajectory_id"))

    def evaluate(self, checkpoint: str, tasks: Sequence[Task], samples: int, *, sampling: SamplingConfig,
                 cfg: RolloutConfig, seed: int) -> np.ndarray:
        """``rollout.evaluate_rewards`` sharded by prompt text: rewards ``(len(tasks), samples)``."""
        shards = shard_groups([t.question for t in tasks], [samples] * len(tasks), self.shards)
        payloads = [{"tasks": [tasks[i] for i in s], "samples": samples, "sampling": sampling, "cfg": cfg, "seed": seed}
                    for s in shards]
        parts = self.submit(lambda a, p: a.evaluate.remote(checkpoint, **p), payloads).collect()
        out = np.zeros((len(tasks), samples), dtype=float)
        for s, rewards in zip(shards, parts, strict=True):
            out[s] = rewards
        return out


class PoolStage:
    """Shards submitted to a pool: one per free worker, the rest queued; ``collect`` waits for all,
    re-queueing the shard of a worker that died (on a fresh actor or whichever worker is free first)."""

    def __init__(self, pool: RolloutPool, call: Callable[[Any, dict[str, Any]], Any],
                 payloads: list[dict[str, Any]]) -> None:
        self.pool, self.call, self.payloads = pool, call, payloads
        self.results: list[Any] = [None] * len(payloads)
        self.queue = deque(range(len(payloads)))
        self.running: dict[Any, tuple[int, Any]] = {}
        self.idle = list(pool.actors)
        pool.restarts = 0
        self._fill()

    def _fill(self) -> None:
        while self.queue and self.idle:
            actor, i = self.idle.pop(0), self.queue.popleft()
            self.running[self.call(actor, self.payloads[i])] = (i, actor)

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
