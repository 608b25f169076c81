"""Rollout tokens/s on the Ray rollout pool: 2 one-thread HF workers vs 1, and Ray's overhead.

    PYTHONPATH=. python benchmarks/speed/bench_ray_pool.py [--config configs/tiny.yaml] [--prompts 24] [--m 8]

The batch is the main job's raw-rollout stage: ``--prompts`` prompts of iteration 0's candidate
pool x ``--m`` multi-turn episodes each, the config's sampling and limits. Measured, each
``--repeats`` times (median; runs alternate so a change in machine load hits all three):

* in-process: ``rollouts.LocalRollouts.raw`` here (the agent loop), torch on 1 thread;
* pool(1), pool(2): ``RolloutPool.raw`` with 1 and 2 one-thread actors (weights already loaded;
  the timed call is the whole stage: sharding, dispatch, the actors' rollouts, collection and
  reassembly).

Ray overhead per stage = pool(1) - in-process (the same work on one thread, plus everything Ray
adds). Both Ray and the workers are started before timing (a run starts them once). The machine's
1-minute load average and the CPU cores the generating processes actually got (their CPU seconds /
wall seconds) are printed: other processes share the CPUs, and 2 workers cannot beat 1 on 1 core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from trace_core.config import load_train_config  # noqa: E402
from trace_core.engines.pool import RolloutPool  # noqa: E402
from trace_core.envs.datasets import build_environments  # noqa: E402
from trace_core.rollout.local import LocalRollouts  # noqa: E402
from trace_core.runtime import rollout_config  # noqa: E402
from trace_core.stages.prompt_pools import candidate_pool  # noqa: E402
from trace_core.stages.run import initial_checkpoint  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shards-per-worker", type=int, default=None, help="ray.shards_per_worker (default: config's)")
    args = ap.parse_args()

    import ray

    spw = [f"ray.shards_per_worker={args.shards_per_worker}"] if args.shards_per_worker else []
    cfg = load_train_config(args.config, ["run.threads=1", "run.rollout_workers=2", *spw])
    torch.set_num_threads(1)
    ck = initial_checkpoint(cfg)
    tasks = list(candidate_pool(cfg, 0))[:args.prompts]
    kw = {"sampling": cfg.sampling, "cfg": rollout_config(cfg).model_copy(update={"progress": False}),
          "seed": 11, "run_id": "bench", "iteration": 0}
    counts = [args.m] * len(tasks)
    print(f"load before: {os.getloadavg()[0]:.2f}  batch: {len(tasks)} prompts x {args.m} episodes, "
          f"{cfg.ray.shards_per_worker} shards per worker, "
          f"max_new_tokens={cfg.sampling.max_new_tokens}, max_turns={cfg.env.max_turns}", flush=True)

    # 3 logical CPUs: pool(1)'s actor idles while pool(2)'s two run (the machine has 2 cores)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    pols = {w: RolloutPool(cfg, workers=w) for w in (1, 2)}
    local = LocalRollouts.for_config(cfg, build_environments(cfg.env, cfg.data), engine=cfg.run.engine, threads=1)
    local.live.get(ck, engine=local.engine, threads=local.threads)  # its weights loaded before timing
    runs = {"in-process": lambda: local.raw(ck, tasks, counts, **kw),
            "pool(1)": lambda: pols[1].raw(ck, tasks, counts, **kw),
            "pool(2)": lambda: pols[2].raw(ck, tasks, counts, **kw)}
    for name in ("pool(1)", "pool(2)"):  # weights loaded in every actor before timing
        runs[name]()
    procs = {"in-process": [os.getpid()],
             **{f"pool({w})": ray.get([a.pid.remote() for a in pols[w].actors]) for w in (1, 2)}}

    def cpu_of(pid: int) -> float:  # user + system seconds of a process (Linux /proc)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def cpu(name: str) -> float:
        return sum(cpu_of(p) for p in procs[name])

    times: dict[str, list[float]] = {k: [] for k in runs}
    cores: dict[str, list[float]] = {k: [] for k in runs}
    cpu_s: dict[str, list[float]] = {k: [] for k in runs}
    split: list[list[float]] = []  # pool(2): CPU seconds of each worker
    tokens = {}
    for rep in range(args.repeats):
        for name, fn in runs.items():
            each, c, t = [cpu_of(p) for p in procs[name]], cpu(name), time.perf_counter()
            nodes = fn()
            times[name].append(time.perf_counter() - t)
            cpu_s[name].append(cpu(name) - c)
            cores[name].append(cpu_s[name][-1] / times[name][-1])  # cores the generating processes got
            if name == "pool(2)":
                split.append([cpu_of(p) - e for p, e in zip(procs[name], each, strict=True)])
            tokens[name] = int(nodes["new_tokens"].sum())
            print(f"  {name:10s} rep {rep}: {times[name][-1]:6.2f} s  {tokens[name]} tokens  "
                  f"{cores[name][-1]:.2f} cores  load {os.getloadavg()[0]:.2f}", flush=True)
    assert len(set(tokens.values())) == 1, tokens  # the same episodes everywhere
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: tokens[k] / med[k] for k in med}
    print(f"\nmedian of {args.repeats}:")
    for k in runs:
        print(f"  {k:10s} {med[k]:6.2f} s  {tps[k]:8.0f} tok/s  {statistics.median(cores[k]):.2f} cores  "
              f"{tokens[k] / statistics.median(cpu_s[k]):6.0f} tok per CPU-second")
    print("pool(2) CPU seconds of each worker per rep: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in split))
    print(f"speed-up pool(2) / pool(1): {tps['pool(2)'] / tps['pool(1)']:.2f}x")
    print(f"Ray overhead per stage: pool(1) - in-process = {med['pool(1)'] - med['in-process']:+.2f} s "
          f"({100 * (med['pool(1)'] - med['in-process']) / med['in-process']:+.1f}% of the stage)")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    for p in pols.values():
        p.close()
    ray.shutdown()


if __name__ == "__main__":
    main()
