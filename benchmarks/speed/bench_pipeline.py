"""Pipelined (run.max_staleness = 1) against synchronous (0) wall seconds per iteration, side by
side in one process on the Ray pool: one rollout worker and the update on one thread each (the
2 cores here), the same config and seed. Target: pipelined <= 0.75x synchronous.

Then a projection for a GPU pool from the measured stage shares, in the form verl (one-step-off)
and AReaL report theirs: T_sync = rollout side + update + weight push; one-step-off overlap
T_async = max(rollout side, update) + weight push; speed-up T_sync / T_async.

    PYTHONPATH=. python benchmarks/speed/bench_pipeline.py [--iterations 4] [--repeats 1] [--set key=value ...]

The load average is printed beside every figure: the machine is shared, and a second job on
the two cores takes the core the overlap needs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POOL = ["run.rollout_workers=1", "ray.worker_threads=1", "ray.cpus_per_worker=1", "run.threads=1"]
ROLLOUT_STAGES = ("predictor", "roots", "raw", "prefixes", "extensions", "verified")
GENERATION = ("raw", "extensions")


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def one_run(cfg, staleness: int, home: Path, run_id: str) -> dict:
    from flows.train import train_flow

    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"max_staleness": staleness})})
    t0 = time.perf_counter()
    out = train_flow(cfg.model_dump(mode="json"), run_id=run_id, home=str(home))
    timings = out["timings"]
    per_iter = sum(t.iteration_s for t in timings) / len(timings)
    stages = {k: sum(t.stages[k] for t in timings) / len(timings) for k in timings[0].stages}
    return {"S": staleness, "per_iter": per_iter, "flow": time.perf_counter() - t0, "stages": stages,
            "evaluate": sum(t.evaluate_s for t in timings) / len(timings), "load": load(), "out": out}


def weight_push_seconds(cfg, checkpoints: list[str]) -> float:
    """Seconds to load a new checkpoint's weights into a live engine (what a rollout worker does
    once per version), the median over the run's checkpoints."""
    import statistics

    from trace_core.policy.live import LivePolicy

    live = LivePolicy(cfg)
    live.get(checkpoints[0], engine="hf", threads=1)
    times = []
    for ckpt in checkpoints[1:]:
        t0 = time.perf_counter()
        live.get(ckpt, engine="hf", threads=1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def projection(gen: float, other_rollout: float, update: float, push: float) -> tuple[float, float, float]:
    """(T_sync, T_async, speed-up) of one-step-off overlap for stage seconds (or shares)."""
    sync = gen + other_rollout + update + push
    pipelined = max(gen + other_rollout, update) + push
    return sync, pipelined, sync / pipelined


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "small-ci.yaml"))
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1, help="synchronous/pipelined pairs, alternating")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trace-bench-pipeline-"))
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "900")
    from flows.lifecycle import temporary_server
    from trace_core.config import load_train_config

    cfg = load_train_config(args.config, [f"run.iterations={args.iterations}", *POOL, *args.overrides])
    print(f"config {args.config} x {args.iterations} iterations, {' '.join(POOL + args.overrides)}; {load()}")
    runs = []
    with temporary_server():  # one server for every run (its start is not what is measured)
        for r in range(args.repeats):
            for s in (0, 1):
                res = one_run(cfg, s, home, f"bench-s{s}-r{r}")
                runs.append(res)
                print(f"S={s} repeat {r}: {res['per_iter']:.2f} s / iteration (flow {res['flow']:.1f} s incl. Ray "
                      f"start and evaluations); {res['load']}", flush=True)
    sync = [x["per_iter"] for x in runs if x["S"] == 0]
    pipe = [x["per_iter"] for x in runs if x["S"] == 1]
    ratio = (sum(pipe) / len(pipe)) / (sum(sync) / len(sync))
    print(f"\npipelined / synchronous wall per iteration: {sum(pipe) / len(pipe):.2f} / {sum(sync) / len(sync):.2f} s "
          f"= {ratio:.2f}x (target <= 0.75x); {load()}")

    # stage shares of the synchronous run (the last one): what a GPU projection starts from
    st = [x for x in runs if x["S"] == 0][-1]["stages"]
    ckpts = [str(home / "runs" / runs[0]["out"]["run_id"] / "checkpoints" / f"iter={i:05d}")
             for i in range(args.iterations)]
    push = weight_push_seconds(cfg, [c for c in ckpts if Path(c, "model.safetensors").is_file()])
    gen = sum(st[k] for k in GENERATION)
    other = sum(st[k] for k in ROLLOUT_STAGES if k not in GENERATION)
    upd = st["update"]
    total = gen + other + upd + push
    print(f"\nmeasured per iteration (synchronous): generation {gen:.2f} s ({gen / total:.0%}), other rollout-side "
          f"stages {other:.2f} s ({other / total:.0%}), update {upd:.2f} s ({upd / total:.0%}), weight push "
          f"{push:.2f} s ({push / total:.0%}; a checkpoint reloaded into a live engine)")
    s_, a_, x_ = projection(gen, other, upd, push)
    print(f"one-step-off bound on these shares: {a_:.2f} s vs {s_:.2f} s = {x_:.2f}x faster ({a_ / s_:.2f}x the "
          f"time); measured {1 / ratio:.2f}x on 2 shared cores")
    print("\nGPU pool projection (shares of a synchronous step; generation 70-80% as OpenRLHF and verl report):")
    print(f"{'generation':>10} {'update':>7} {'push':>5}  {'T_async/T_sync':>14}  speed-up")
    for g, u, p in ((0.70, 0.27, 0.03), (0.75, 0.22, 0.03), (0.80, 0.17, 0.03), (0.75, 0.20, 0.05)):
        s_, a_, x_ = projection(g, 0.0, u, p)
        print(f"{g:>10.0%} {u:>7.0%} {p:>5.0%}  {a_ / s_:>14.2f}  {x_:.2f}x")
    print("only a GPU can confirm: the shares themselves (vLLM generation vs FSDP update), the weight push over "
          "NCCL / CUDA IPC instead of a checkpoint reload, and that generation and training run on separate "
          "devices (a colocated engine sleeps during the update: no overlap is possible there).")


if __name__ == "__main__":
    main()
