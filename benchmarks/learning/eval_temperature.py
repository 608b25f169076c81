"""Re-score a home's checkpoints on their runs' own held-out pool at another sampling temperature.

    PYTHONPATH=. python benchmarks/learning/eval_temperature.py --home H --runs cv-grpo-s0,cv-trace-s0 \
        --iterations 5,10 --temperature 0.6

Held-out accuracy at temperature 1 (what the flow logs) mixes two things: what the policy learned
and how peaked its distribution is. Re-scoring the warm start and the trained checkpoints at a
lower temperature (or ``--temperature 0``: greedy) separates them: a gain that survives at low
temperature is learning, one that vanishes was entropy. The held-out prompts and the sampling
seeds are the run's own (``trace_core.stages.iteration.evaluate`` with the run's config, only
``sampling.temperature`` changed). Prints one line per (run, checkpoint) and a final ``RESULT``
JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from trace_core.config import TrainConfig
from trace_core.config.io import load_config
from trace_core.stages.iteration import evaluate
from trace_core.stages.run import initial_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", required=True)
    ap.add_argument("--runs", required=True, help="comma-separated run ids")
    ap.add_argument("--iterations", default="5,10", help="iterations trained (checkpoint iter=N-1); 0 = warm start")
    ap.add_argument("--temperature", type=float, required=True, help="0 = greedy")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = []
    for run in a.runs.split(","):
        rdir = Path(a.home) / "runs" / run
        cfg = load_config(TrainConfig, rdir / "artifacts" / "config.yaml",
                          [f"sampling.temperature={a.temperature}", f"run.threads={a.threads}"])
        for it in [0] + [int(x) for x in a.iterations.split(",") if x.strip() and int(x)]:
            ckpt = initial_checkpoint(cfg) if it == 0 else str(rdir / "checkpoints" / f"iter={it - 1:05d}")
            t0 = time.perf_counter()
            ev = evaluate(cfg, ckpt)
            row = {"run": run, "iteration": it, "temperature": a.temperature, "accuracy": ev.accuracy,
                   "by_family": ev.by_family, "probe": ev.probe_accuracy}
            out.append(row)
            fam = " ".join(f"{k} {100 * v:.1f}" for k, v in sorted((ev.by_family or {}).items()))
            print(f"{run} iter {it:>2} T={a.temperature}: held-out {100 * ev.accuracy:.1f} ({fam}) "
                  f"probe {100 * (ev.probe_accuracy or 0):.1f}  [{time.perf_counter() - t0:.0f}s]", flush=True)
    print("RESULT", json.dumps(out))


if __name__ == "__main__":
    main()
