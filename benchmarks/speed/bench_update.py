"""Policy-update throughput: trajectories (samples) per second through the clipped-surrogate step.

    PYTHONPATH=. python benchmarks/speed/bench_update.py [--model DIR] [--batch 64] [--bf16]
        [--chunk 256] [--grad-ckpt] [--kl 0.05] [--strategy fsdp|ddp --world-size 2]

The batch is real: ``--prompts`` math prompts x ``--n`` sampled episodes from the policy
(multi-turn, with tool observations), rewards -> GRPO advantages -> training sequences; then
``--steps`` updates over it are timed (zero-advantage groups kept so every sequence is trained).
With ``--strategy fsdp|ddp`` each step is one ``torchrun`` launch (``trace_core.policy.distributed``):
the line reports the ranks' update time and the launch's wall time (process start, loading, saving).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _policy
from _policy import bench_policy  # noqa: E402

from trace_core.advantages.config import AdvantageConfig  # noqa: E402
from trace_core.advantages.estimators import compute_advantages  # noqa: E402
from trace_core.engines.config import SamplingConfig  # noqa: E402
from trace_core.engines.hf import HFEngine  # noqa: E402
from trace_core.envs import make_env  # noqa: E402
from trace_core.envs.synthetic import generate_tasks  # noqa: E402
from trace_core.policy.checkpoint import save_checkpoint  # noqa: E402
from trace_core.policy.distributed import UpdateJob, launch_update  # noqa: E402
from trace_core.policy.update import UpdateConfig, build_sequences, make_optimizer, update_policy  # noqa: E402
from trace_core.rollout.agent_loop import RolloutConfig, run_rollouts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward/backward")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=0, help="update.logprob_chunk (positions per log-softmax chunk)")
    ap.add_argument("--grad-ckpt", action="store_true", help="update.gradient_checkpointing")
    ap.add_argument("--kl", type=float, default=0.0, help="update.kl_coef (reference: the starting policy)")
    ap.add_argument("--strategy", choices=["single", "fsdp", "ddp"], default="single")
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--memory-vocab", type=int, default=0,
                    help="instead: peak RSS of one log-prob forward+backward of a random model with this vocab")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_vocab:
        return logprob_memory(args.memory_vocab, args.chunk)
    model, chat, what = bench_policy(args.model)
    env = make_env("math")
    tasks = [t for d in range(4) for t in generate_tasks("math", args.prompts // 4 or 1, d, seed=5)]
    nodes = run_rollouts(HFEngine(model, chat), chat, {"math": env}, tasks, [args.n] * len(tasks),
                         sampling=SamplingConfig(max_new_tokens=64, seed=1), cfg=RolloutConfig(progress=False))
    nodes = compute_advantages(nodes, AdvantageConfig(estimator="grpo"))
    msgs = {t.prompt_id: env.reset(t).messages() for t in tasks}
    seqs = build_sequences(nodes, chat, msgs, skip_zero_advantage=False)
    lens = [len(s.input_ids) for s in seqs]
    cfg = UpdateConfig(minibatch_size=len(seqs), micro_batch_size=args.micro, autocast_bf16=args.bf16,
                       logprob_chunk=args.chunk, gradient_checkpointing=args.grad_ckpt, kl_coef=args.kl,
                       strategy=args.strategy, world_size=args.world_size)
    if args.strategy != "single":
        sec, wall = distributed_steps(model, chat, seqs, cfg, args)
    else:
        ref = None
        if args.kl:
            ref = type(model)(model.config).requires_grad_(False)
            ref.load_state_dict(model.state_dict())
        opt, sched = make_optimizer(model, cfg)
        update_policy(model, opt, sched, seqs[: args.micro], cfg, pad_id=chat.pad_token_id, ref_model=ref)  # warm-up
        t = time.perf_counter()
        for k in range(args.steps):
            update_policy(model, opt, sched, seqs, cfg, pad_id=chat.pad_token_id, seed=k, ref_model=ref)
        sec = wall = (time.perf_counter() - t) / args.steps
    tokens = sum(lens)
    print(f"policy: {what}; threads={args.threads}; bf16={args.bf16}; chunk={args.chunk}; "
          f"grad_ckpt={args.grad_ckpt}; kl={args.kl}; {args.strategy} x {args.world_size}")
    print(f"update: {len(seqs)} trajectories (mean {sum(lens) / len(lens):.0f} tokens, max {max(lens)}), "
          f"micro-batch {args.micro}: {sec:.2f} s/step -> {len(seqs) / sec:.1f} samples/s, {tokens / sec:,.0f} tokens/s"
          + (f"; launch wall {wall:.1f} s/step" if args.strategy != "single" else ""))


def logprob_memory(vocab: int, chunk: int, batch: int = 2, length: int = 1024) -> None:
    """Peak RSS of token_logprobs + backward on a hidden-64 Qwen3 with a large vocab, where the
    (B, L, V) fp32 logits dominate; run once per ``--chunk`` value, each in a fresh process."""
    import resource

    from trace_core.policy.model import ModelConfig, build_model
    from trace_core.policy.update import token_logprobs

    model = build_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                                    intermediate_size=128, vocab_size=vocab, tie_embeddings=True))
    ids = torch.randint(0, vocab, (batch, length))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    lp = token_logprobs(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, chunk=chunk)
    lp.sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"vocab {vocab}, {batch} x {length} tokens, chunk {chunk}: peak RSS +{(peak - before) / 1024:.0f} MiB "
          f"(logits alone {batch * length * vocab * 4 / 2**20:.0f} MiB), {time.perf_counter() - t:.2f} s")


def distributed_steps(model, chat, seqs, cfg: UpdateConfig, args) -> tuple[float, float]:
    """Mean (ranks' update seconds, launch wall seconds) over ``args.steps`` torchrun updates, each
    continuing from the previous one's checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = save_checkpoint(Path(tmp) / "start", model, tokenizer=chat.tokenizer)
        start, secs, walls = ckpt, [], []
        for k in range(args.steps):
            out = Path(tmp) / f"step{k}"
            job = UpdateJob(checkpoint=str(ckpt), out=str(out), reference=str(start) if args.kl else None, update=cfg,
                            seed=k, pad_id=chat.pad_token_id, threads=args.threads)
            t = time.perf_counter()
            stats = launch_update(job, seqs, Path(tmp) / "job")
            walls.append(time.perf_counter() - t)
            secs.append(stats.seconds)
            ckpt = out
    return sum(secs) / len(secs), sum(walls) / len(walls)


if __name__ == "__main__":
    main()
