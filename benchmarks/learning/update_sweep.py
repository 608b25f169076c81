"""Update settings against held-out accuracy: plain GRPO on fresh synthetic prompts, no Prefect/MLflow.

    PYTHONPATH=. python benchmarks/learning/update_sweep.py --prompts 96 --mb 1000 --iters 15 --eval-every 5
    PYTHONPATH=. python benchmarks/learning/update_sweep.py --iters 1 --prompts 4 --eval-per-cell 1 --eval-n 1 --eval-every 1  # smoke

Each iteration: ``--prompts`` fresh prompts (all families, difficulties 0-3) x ``--n`` rollouts with
the HF engine, GRPO advantages (``--adv``: or their positive part, the reward alone = fine-tuning on
the successes, std-scaled; ``demo``: no rollouts, the generator's correct demonstrations of the same
prompts, a supervised control of the update path), one clipped-surrogate update (``--mb``
trajectories per optimizer step, ``--epochs`` passes; ``--lr``, ``--warmup``, ``--kl``,
``--freeze-emb``, ``--eps``, ``--norm-lr``, ``--opt sgd``). Held-out accuracy: ``--eval-per-cell`` fixed
prompts per (family, difficulty) cell x ``--eval-n`` samples with fixed sampling seeds (the same
episodes' randomness for every checkpoint), every ``--eval-every`` iterations; beside it the reward
on 48 fixed prompts of the training distribution (probe); ``--iters 0 --eval-temperature T`` scores
the warm start alone at temperature T. Prints an ``EVAL`` line per evaluation and a final ``RESULT``
JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import polars as pl
import torch

from trace_core.advantages.config import AdvantageConfig
from trace_core.advantages.estimators import compute_advantages
from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine
from trace_core.envs import make_envs
from trace_core.envs.config import EnvConfig
from trace_core.envs.synthetic import generate_tasks, sample_tasks
from trace_core.policy.chat import ChatFormat
from trace_core.policy.config import UpdateConfig
from trace_core.policy.demos import run_demo
from trace_core.policy.model import load_policy
from trace_core.policy.update import TrainSequence, build_sequences, token_logprobs, update_policy
from trace_core.rollout.agent_loop import RolloutConfig, run_rollouts

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
    ap.add_argument("--adv", choices=["grpo", "pos", "rft", "std", "demo"], default="grpo",
                    help="grpo: r - group mean; pos: its positive part only; rft: reward (1 on a success, 0 "
                         "else: fine-tuning on the successes); std: (r - mean) / std (the original GRPO); demo: the generator's correct demonstrations of the same prompts, "
                         "advantage 1 (a supervised control of the update path)")
    ap.add_argument("--norm-lr", type=float, default=None,
                    help="learning rate of the 1-D parameters (the RMSNorm gains; default --lr): a gain "
                         "scales every logit at once, what sampling less noisily needs")
    ap.add_argument("--opt", choices=["adamw", "sgd"], default="adamw",
                    help="sgd: plain SGD (the step is the gradient times lr: noise-dominated coordinates move "
                         "little, unlike Adam's ~lr per coordinate)")
    ap.add_argument("--warmup", type=int, default=0, help="linear LR warm-up in optimizer steps")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the batch per iteration")
    ap.add_argument("--eval-temperature", type=float, default=1.0,
                    help="sampling temperature of the evaluations (training samples at 1)")
    ap.add_argument("--eval-per-cell", type=int, default=42)
    ap.add_argument("--eval-n", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="policy dir (default: the shipped tiny-warm)")
    return ap.parse_args()


def _demo_sequences(model, chat, envs, tasks) -> list[TrainSequence]:
    """The generator's correct demonstration of each task as a training sequence with advantage 1
    on its action tokens and the current policy's log-probs as the old ones (ratio 1)."""
    seqs = []
    for task in tasks:
        demo = run_demo(task, envs[task.family])
        if demo is None:
            continue
        ids, mask = chat.episode_ids(demo.messages, demo.actions, demo.observations)
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        with torch.no_grad():
            old = token_logprobs(model, batch)[0].tolist()
        seqs.append(TrainSequence(ids, mask, [float(m) for m in mask], old, task.prompt_id))
    return seqs


def _reshape_advantages(nodes: pl.DataFrame, how: str) -> pl.DataFrame:
    """The advantage variants of ``--adv`` from the GRPO column (r - group mean, on every turn)."""
    if how == "grpo":
        return nodes
    adv = pl.col("advantage")
    if how == "pos":
        return nodes.with_columns(pl.when(adv > 0).then(adv).otherwise(0.0).alias("advantage"))
    reward = pl.col("reward").fill_null(0.0).max().over("trajectory_id")
    if how == "rft":
        return nodes.with_columns(pl.when(adv.is_not_null()).then(reward).otherwise(None).alias("advantage"))
    leaves = nodes.filter(pl.col("is_leaf")).group_by("prompt_id").agg(pl.col("reward").std(ddof=0).alias("_std"))
    nodes = nodes.join(leaves, on="prompt_id", how="left")
    std = pl.col("_std")
    return nodes.with_columns(pl.when(std > 0).then(adv / (std + 1e-6)).otherwise(adv * 0.0)
                              .alias("advantage")).drop("_std")


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
    ucfg = UpdateConfig(lr=min(a.lr, 1.0), minibatch_size=a.mb, micro_batch_size=16, kl_coef=a.kl, ppo_epochs=a.epochs)
    if a.freeze_emb:
        model.get_input_embeddings().weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2]},
              {"params": [p for p in params if p.ndim < 2], "lr": a.norm_lr or a.lr}]
    opt = (torch.optim.SGD(groups, lr=a.lr) if a.opt == "sgd"
           else torch.optim.AdamW(groups, lr=a.lr, betas=ucfg.betas, weight_decay=0.0, eps=a.eps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup) if a.warmup else 1.0)
    ref = load_policy(a.model)[0].requires_grad_(False).eval() if a.kl > 0 else None
    heldout = [t for f in ("math", "qa", "fc") for d in range(4)
               for t in generate_tasks(f, a.eval_per_cell, d, seed=HELDOUT_SEED + a.seed)]
    probe = sample_tasks(env_cfg, 48, seed=PROBE_SEED + a.seed)

    def evaluate(tasks, n: int, seed: int) -> tuple[float, dict[str, float]]:
        at = sampling.model_copy(update={"seed": seed, "temperature": a.eval_temperature})
        nodes = run_rollouts(engine, chat, envs, tasks, [n] * len(tasks), sampling=at,
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
        if a.adv == "demo":  # no rollouts: the supervised control trains on demonstrations only
            seqs = _demo_sequences(model, chat, envs, tasks)
            stats = update_policy(model, opt, sched, seqs, ucfg, pad_id=chat.pad_token_id, seed=it)
            print(f"it {it} demos {len(seqs)} steps {stats.steps:.0f} loss {stats.loss or 0:.4f}", flush=True)
            if (it + 1) % a.eval_every == 0:
                log_eval(it + 1)
            continue
        nodes = run_rollouts(engine, chat, envs, tasks, [a.n] * len(tasks),
                             sampling=sampling.model_copy(update={"seed": it + 100 * a.seed}), cfg=rcfg,
                             run_id="sweep", iteration=it, seed=it + 100 * a.seed)
        tokens += int(nodes["new_tokens"].sum() or 0)
        nodes = compute_advantages(nodes, AdvantageConfig(estimator="grpo"))
        nodes = _reshape_advantages(nodes, a.adv)
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
