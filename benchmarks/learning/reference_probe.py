"""Does the policy's log-probability of a task's demonstration order its prompts by success?

    PYTHONPATH=. python benchmarks/learning/reference_probe.py --config configs/learning-epochs-192.yaml \\
        --set run.seed=1 --samples 16

For every training prompt of the config (``run.train_prompts`` of them, as the run would draw them)
it computes what ``predictor.reference`` records at stage 2 -- the mean log-probability per action
token of the demonstration under the policy (the shipped one, or ``--checkpoint``) -- and samples
``--samples`` episodes of the prompt under the same policy for its success rate. Printed per family:
the mean Spearman correlation of the score with the sampled rate *within* each (family, difficulty)
cell (the order the root plan needs: the cell's level is the prior's job), beside the same for the
demonstration's total log-probability and its length in tokens. Sampling is the cost; the scores
take one forward pass a prompt (seconds for 256).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import polars as pl
from scipy.stats import spearmanr

from trace_core.analysis.headroom import sampled_success
from trace_core.config import load_train_config
from trace_core.runtime import Runtime
from trace_core.stages.prompt_pools import training_set
from trace_core.stages.reference import demo_ids, demo_logprobs
from trace_core.stages.run import initial_checkpoint


def within_cell(frame: pl.DataFrame, col: str) -> float:
    """Mean Spearman correlation of ``col`` with ``v_true`` over the cells where both vary."""
    rhos = [spearmanr(c[col], c["v_true"]).statistic for _, c in frame.group_by("difficulty")
            if c.height > 4 and c["v_true"].std() > 0 and c[col].std() > 0]
    return float(np.mean(rhos)) if rhos else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/learning-epochs-192.yaml")
    ap.add_argument("--set", action="append", default=[], help="config override (repeatable)")
    ap.add_argument("--checkpoint", default=None, help="policy directory (default: the run's initial checkpoint)")
    ap.add_argument("--samples", type=int, default=16, help="episodes per prompt for its success rate")
    ap.add_argument("--out", default=None, help="write the per-prompt table here (Parquet)")
    args = ap.parse_args()
    cfg = load_train_config(args.config, args.set)
    tasks = list(training_set(cfg))
    ckpt = args.checkpoint or initial_checkpoint(cfg)
    with Runtime(cfg) as rt:
        policy = rt.live.get(ckpt)
        t0 = time.perf_counter()
        episodes = [demo_ids(t, rt.envs[t.family], policy.chat, cfg.model.max_position_embeddings) for t in tasks]
        mean = demo_logprobs(policy.model, episodes, policy.chat.pad_token_id, temperature=cfg.sampling.temperature)
        score_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        v = sampled_success(rt, cfg, ckpt, tasks, args.samples, seed=cfg.run.seed + 12345)
        sample_s = time.perf_counter() - t0
    n_tok = np.array([sum(e[1]) if e is not None else np.nan for e in episodes], dtype=float)
    frame = pl.DataFrame({"prompt_id": [t.prompt_id for t in tasks], "family": [t.family for t in tasks],
                          "difficulty": [t.difficulty for t in tasks], "lp_mean": mean, "lp_sum": mean * n_tok,
                          "n_tok": n_tok, "v_true": v}).filter(pl.col("lp_mean").is_not_nan())
    if args.out:
        frame.write_parquet(args.out)
    print(f"{len(tasks)} prompts, {frame.height} with a demonstration; scores {score_s:.1f} s, "
          f"{args.samples} samples each {sample_s:.1f} s (load {os.getloadavg()[0]:.1f})")
    print("within-cell Spearman with the sampled success rate (mean over difficulties)")
    print(f"{'family':8} {'n':>4} {'lp_mean':>8} {'lp_sum':>8} {'n_tok':>8}")
    for fam in sorted(frame["family"].unique()):
        f = frame.filter(pl.col("family") == fam)
        print(f"{fam:8} {f.height:4d} " + " ".join(f"{within_cell(f, c):+8.2f}" for c in ("lp_mean", "lp_sum", "n_tok")))


if __name__ == "__main__":
    main()
