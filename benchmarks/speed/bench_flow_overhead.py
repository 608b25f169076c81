"""Where an iteration's wall time goes on the tiny config: the stages' own work (generation,
update, predictor, shard writes inside the tasks) against orchestration + tracking overhead
(Prefect task runs, result persistence, MLflow logging, UI artifacts). Goal: overhead <= 5%.

    PYTHONPATH=. python benchmarks/speed/bench_flow_overhead.py [--iterations 3] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trace-bench-"))
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    from flows.train import train_flow
    from trace_core.config import load_train_config

    cfg = load_train_config(args.config, [f"run.iterations={args.iterations}", *args.overrides])
    t0 = time.perf_counter()
    out = train_flow(cfg.model_dump(mode="json"), run_id="bench", home=str(home))
    total = time.perf_counter() - t0
    rows, timings = out["iterations"], out["timings"]  # IterationTiming per iteration
    table = [{**t.stages, "evaluate": t.evaluate_s, "iteration": t.iteration_s, "overhead": t.overhead_s}
             for t in timings]
    names = sorted({k for c in table for k in c})
    print(f"{'iteration':>9} " + " ".join(f"{k:>10}" for k in names) + "  overhead")
    for r, c, t in zip(rows, table, timings, strict=True):
        print(f"{r['iteration']:>9} " + " ".join(f"{c.get(k, 0.0):>10.2f}" for k in names)
              + f"  {t.overhead_share:>7.1%}")
    wall = sum(t.iteration_s for t in timings)
    over = sum(t.overhead_s for t in timings)
    print(f"iterations: {wall:.1f}s wall, overhead {over:.1f}s = {over / wall:.1%} (goal <= 5%); "
          f"whole flow incl. server start and evaluation: {total:.1f}s")


if __name__ == "__main__":
    main()
