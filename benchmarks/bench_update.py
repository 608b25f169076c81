"""Policy-update throughput: trajectories (samples) per second through the clipped-surrogate step.

    PYTHONPATH=. python benchmarks/bench_update.py [--model DIR] [--batch 64] [--bf16]

The batch is real: ``--prompts`` math prompts x ``--n`` sampled episodes from the policy
(multi-turn, with tool observations), rewards -> GRPO advantages -> training sequences; then
``--steps`` updates over it are timed (zero-advantage groups kept so every sequence is trained).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _policy import bench_policy  # noqa: E402

from trace_core.advantage import AdvantageConfig, compute_advantages  # noqa: E402
from trace_core.engines.base import SamplingConfig  # noqa: E402
from trace_core.engines.hf import HFEngine  # noqa: E402
from trace_core.envs import make_env  # noqa: E402
from trace_core.envs.synthetic import generate_tasks  # noqa: E402
from trace_core.policy.update import UpdateConfig, build_sequences, make_optimizer, update_policy  # noqa: E402
from trace_core.rollout import RolloutConfig, run_rollouts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward/backward")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, chat, what = bench_policy(args.model)
    env = make_env("math")
    tasks = [t for d in range(4) for t in generate_tasks("math", args.prompts // 4 or 1, d, seed=5)]
    nodes = run_rollouts(HFEngine(model, chat), chat, {"math": env}, tasks, [args.n] * len(tasks),
                         sampling=SamplingConfig(max_new_tokens=64, seed=1), cfg=RolloutConfig(progress=False))
    nodes = compute_advantages(nodes, AdvantageConfig(estimator="grpo"))
    msgs = {t.prompt_id: env.reset(t).messages() for t in tasks}
    seqs = build_sequences(nodes, chat, msgs, skip_zero_advantage=False)
    lens = [len(s.input_ids) for s in seqs]
    cfg = UpdateConfig(minibatch_size=len(seqs), micro_batch_size=args.micro, autocast_bf16=args.bf16)
    opt, sched = make_optimizer(model, cfg)
    update_policy(model, opt, sched, seqs[: args.micro], cfg, pad_id=chat.pad_token_id)  # warm-up
    t = time.perf_counter()
    for k in range(args.steps):
        update_policy(model, opt, sched, seqs, cfg, pad_id=chat.pad_token_id, seed=k)
    sec = (time.perf_counter() - t) / args.steps
    tokens = sum(lens)
    print(f"policy: {what}; threads={args.threads}; bf16={args.bf16}")
    print(f"update: {len(seqs)} trajectories (mean {sum(lens) / len(lens):.0f} tokens, max {max(lens)}), "
          f"micro-batch {args.micro}: {sec:.2f} s/step -> {len(seqs) / sec:.1f} samples/s, {tokens / sec:,.0f} tokens/s")


if __name__ == "__main__":
    main()
