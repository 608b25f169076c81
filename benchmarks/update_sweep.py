"""Update settings against held-out accuracy: plain GRPO on fresh synthetic prompts, no Prefect/MLflow.

    PYTHONPATH=. python benchmarks/update_sweep.py --prompts 96 --mb 1000 --iters 15 --eval-every 5
    PYTHONPATH=. python benchmarks/update_sweep.py --iters 1 --prompts 4 --eval-per-cell 1 --eval-n 1 --eval-every 1  # smoke

Each iteration: ``--prompts`` fresh prompts (all families, difficulties 0-3) x ``--n`` rollouts with
the HF engine, GRPO advantages, one clipped-surrogate update (``--mb`` trajectories per optimizer
step; ``--lr``, ``--kl``, ``--freeze-emb``, ``--eps``). Held-out accuracy: ``--eval-per-cell`` fixed
prompts per (family, difficulty) cell x ``--eval-n`` samples with fixed sampling seeds (the same
episodes' randomness for every checkpoint), every ``--eval-every`` iterations; beside it the reward
on 48 fixed prompts of the training distribution (probe). Prints an ``EVAL`` line per evaluation
and a final ``RESULT`` JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import polars as pl
import torch

from trace_core.advantage import compute_advantages
from trace_core.advantage_config import AdvantageConfig
from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine
from trace_core.envs import make_envs
from trace_core.envs.config import EnvConfig
from trace_core.envs.synthetic import generate_tasks, sample_tasks
from trace_core.policy.chat import ChatFormat
from trace_core.policy.config import UpdateConfig
from trace_core.policy.model import load_policy
from trace_core.policy.update import build_sequences, update_policy
from trace_core.rollout import RolloutConfig, run_rollouts

HELDOUT_SEED, PROBE_SEED = 990_001, 12_345  # disjoint from the training stream's seeds (1..iterations)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=24, help="fresh prompts per iteration")
    ap.add_argument("--n", type=int, default=8, help="rollouts per prompt")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--mb", type=int, default=64, help="trajectories per optimizer step")
    ap.add_argument("--kl", type=float, default=0.0, help="k3 KL coefficient to the warm start")
    ap.add_argument("--freeze-emb", action="store_true", help="train everything but the (tied) embeddings")
    ap.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon")
    ap.add_argument("--eval-per-cell", type=int, default=42)
    ap.add_argument("--eval-n", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="policy dir (default: the shipped tiny-warm)")
    return ap.parse_args()


def main() -> None:
    a = _args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model, tok = load_policy(a.model)
    chat = ChatFormat(tok)
    engine = HFEngine(model, chat)
    env_cfg = EnvConfig(families={"math": 1.0, "qa": 1.0, "fc": 1.0}, difficulties=[0, 1, 2, 3], max_turns=6,
                        prompt_style="compact")
    envs = make_envs(env_cfg)
    sampling = SamplingConfig(temperature=1.0, top_k=0, max_new_tokens=48, seed=0)
    rcfg = RolloutConfig(max_turns=6)
    ucfg = UpdateConfig(lr=a.lr, minibatch_size=a.mb, micro_batch_size=16, kl_coef=a.kl)
    if a.freeze_emb:
        model.get_input_embeddings().weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=ucfg.betas, weight_decay=0.0, eps=a.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ref = load_policy(a.model)[0].requires_grad_(False).eval() if a.kl > 0 else None
    heldout = [t for f in ("math", "qa", "fc") for d in range(4)
               for t in generate_tasks(f, a.eval_per_cell, d, seed=HELDOUT_SEED + a.seed)]
    probe = sample_tasks(env_cfg, 48, seed=PROBE_SEED + a.seed)

    def evaluate(tasks, n: int, seed: int) -> tuple[float, dict[str, float]]:
        nodes = run_rollouts(engine, chat, envs, tasks, [n] * len(tasks), sampling=sampling.model_copy(update={"seed": seed}),
                             cfg=rcfg, run_id="eval", seed=seed)
        leaves = nodes.filter(pl.col("is_leaf"))
        fam = leaves.group_by("task").agg(pl.col("reward").mean()).sort("task")
        return float(leaves["reward"].mean()), {r["task"]: round(100 * float(r["reward"]), 1) for r in fam.iter_rows(named=True)}

    tokens, t0, hist = 0, time.perf_counter(), []

    def log_eval(it: int) -> None:
        acc, fam = evaluate(heldout, a.eval_n, 4242)
        probe_acc, _ = evaluate(probe, 2, 4343)
        hist.append({"iter": it, "tokens": tokens, "acc": acc, "fam": fam, "probe": probe_acc})
        print(f"EVAL it={it} tokens={tokens} acc={100 * acc:.1f} {fam} probe={100 * probe_acc:.1f} "
              f"t={time.perf_counter() - t0:.0f}s", flush=True)

    log_eval(0)
    for it in range(a.iters):
        tasks = sample_tasks(env_cfg, a.prompts, seed=1000 * a.seed + it + 1)
        nodes = run_rollouts(engine, chat, envs, tasks, [a.n] * len(tasks),
                             sampling=sampling.model_copy(update={"seed": it + 100 * a.seed}), cfg=rcfg,
                             run_id="sweep", iteration=it, seed=it + 100 * a.seed)
        tokens += int(nodes["new_tokens"].sum() or 0)
        nodes = compute_advantages(nodes, AdvantageConfig(estimator="grpo"))
        by_id = {t.prompt_id: t for t in tasks}
        seqs = build_sequences(nodes, chat, {p: envs[by_id[p].family].reset(by_id[p]).messages()
                                             for p in nodes["prompt_id"].unique()})
        stats = update_policy(model, opt, sched, seqs, ucfg, pad_id=chat.pad_token_id, seed=it, ref_model=ref)
        reward = float(nodes.filter(pl.col("is_leaf"))["reward"].mean())
        print(f"it {it} reward {reward:.2f} seqs {len(seqs)} steps {stats.steps:.0f} "
              f"grad_norm {stats.grad_norm or 0:.3f}", flush=True)
        if (it + 1) % a.eval_every == 0:
            log_eval(it + 1)
    print("RESULT", json.dumps({"args": vars(a), "hist": hist}))


if __name__ == "__main__":
    main()
