"""Plain GRPO on synthetic math from the shipped warm start: held-out accuracy before / after.

    PYTHONPATH=. python benchmarks/learning/learning_curve.py                 # 20 iterations, 64 prompts x 8
    PYTHONPATH=. python benchmarks/learning/learning_curve.py --smoke         # 2 tiny iterations (checks it runs)

Each iteration: sample ``--prompts`` fresh math prompts (difficulties 0..3) -> ``--n`` rollouts
each with the HF engine -> GRPO advantages (r − mean over the prompt's rollouts) -> one clipped
surrogate update (lr 3e-4; the prototype saw 5e-5 barely move the tiny model). Held-out
accuracy: ``--eval-per-cell`` fixed prompts per difficulty, ``--eval-n`` samples each, before and
after. Uses the shipped ``trace_core/assets/tiny-warm`` (``--model`` to override).
"""

from __future__ import annotations

import argparse
import time

import polars as pl
import torch

from trace_core.advantages.config import AdvantageConfig
from trace_core.advantages.estimators import compute_advantages
from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine
from trace_core.envs import make_env
from trace_core.envs.synthetic import generate_tasks
from trace_core.policy.chat import ChatFormat
from trace_core.policy.model import load_policy
from trace_core.policy.update import UpdateConfig, build_sequences, make_optimizer, update_policy
from trace_core.rollout.agent_loop import RolloutConfig, run_rollouts

HELDOUT_SEED = 990_001  # disjoint from the training stream's seeds (0..iterations)


def accuracy(engine, chat, env, tasks, n, sampling, cfg) -> tuple[float, dict[int, float]]:
    nodes = run_rollouts(engine, chat, {"math": env}, tasks, [n] * len(tasks), sampling=sampling, cfg=cfg,
                         run_id="eval", seed=HELDOUT_SEED)
    leaves = nodes.filter(pl.col("is_leaf"))
    by_d = leaves.group_by("difficulty").agg(pl.col("reward").mean()).sort("difficulty")
    return float(leaves["reward"].mean()), dict(zip(by_d["difficulty"], by_d["reward"], strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="policy dir (default: shipped tiny-warm)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eval-per-cell", type=int, default=50)
    ap.add_argument("--eval-n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="2 iterations of 8 prompts x 4, 4 eval prompts per cell")
    args = ap.parse_args()
    if args.smoke:
        args.iterations, args.prompts, args.n, args.eval_per_cell, args.eval_n = 2, 8, 4, 4, 2
    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model)
    chat = ChatFormat(tok)
    engine = HFEngine(model, chat)
    env = make_env("math")
    sampling = SamplingConfig(temperature=1.0, top_k=0, max_new_tokens=args.max_new_tokens, seed=0)
    rcfg = RolloutConfig(progress=False)
    ucfg = UpdateConfig(lr=args.lr, minibatch_size=args.prompts * args.n, micro_batch_size=16)
    opt, sched = make_optimizer(model, ucfg)
    heldout = [t for d in range(4) for t in generate_tasks("math", args.eval_per_cell, d, seed=HELDOUT_SEED)]
    t0 = time.perf_counter()
    before, before_d = accuracy(engine, chat, env, heldout, args.eval_n, sampling, rcfg)
    print(f"held-out accuracy before: {before:.3f}  by difficulty {_fmt(before_d)}  ({time.perf_counter() - t0:.0f} s)")
    per_d = max(1, args.prompts // 4)
    for it in range(args.iterations):
        t = time.perf_counter()
        tasks = [x for d in range(4) for x in generate_tasks("math", per_d, d, seed=it)]
        nodes = run_rollouts(engine, chat, {"math": env}, tasks, [args.n] * len(tasks), sampling=sampling, cfg=rcfg,
                             run_id="curve", iteration=it, seed=it)
        t_gen = time.perf_counter() - t
        nodes = compute_advantages(nodes, AdvantageConfig(estimator="grpo"))
        seqs = build_sequences(nodes, chat, {x.prompt_id: env.reset(x).messages() for x in tasks})
        m = update_policy(model, opt, sched, seqs, ucfg, pad_id=chat.pad_token_id, seed=it)
        leaves = nodes.filter(pl.col("is_leaf"))
        eff = len(seqs) / max(len(leaves), 1)  # share of trajectories with non-zero advantage
        print(f"iter {it:2d}: train reward {float(leaves['reward'].mean()):.3f}  effective {eff:.2f}  "
              f"loss {m.loss or 0.0:+.4f}  clip {m.clip_frac or 0.0:.3f}  "
              f"gen {t_gen:.1f} s  update {m.seconds or 0.0:.1f} s")
    after, after_d = accuracy(engine, chat, env, heldout, args.eval_n, sampling, rcfg)
    print(f"held-out accuracy after {args.iterations} iterations: {after:.3f}  by difficulty {_fmt(after_d)}")
    print(f"change: {after - before:+.3f}  (held-out {len(heldout)} prompts x {args.eval_n}; "
          f"total {time.perf_counter() - t0:.0f} s)")


def _fmt(d: dict[int, float]) -> str:
    return " ".join(f"d{k}={v:.2f}" for k, v in d.items())


if __name__ == "__main__":
    main()
