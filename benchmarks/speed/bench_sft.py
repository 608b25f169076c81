"""SFT throughput of the tiny policy on real demonstration batches (figures printed, not asserted).

    PYTHONPATH=. python benchmarks/speed/bench_sft.py [--steps 5] [--threads 1 2] [--sizes tiny proto]

For each (model size, threads, bf16 autocast on/off, bucketed / unsorted batches) it runs a few
optimizer steps of the real warm-up loop pieces and prints tokens/s (non-padding tokens) and the
share of compute spent on padding.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from trace_core.policy.chat import ChatFormat
from trace_core.policy.demos import demo_stream
from trace_core.policy.model import ModelConfig, build_model, n_params
from trace_core.policy.tokenizer import train_tokenizer
from trace_core.policy.warmup import bucketed_batches, collate

SIZES = {
    "tiny": ModelConfig(hidden_size=128, head_dim=32, intermediate_size=384),  # configs/tiny.yaml
    "proto": ModelConfig(),  # the prototype's 3.4M
}
FAMILIES = {"math": 1.0, "qa": 1.0, "fc": 1.0}


def episodes(chat: ChatFormat, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    demos = itertools.islice(demo_stream(FAMILIES, [0, 1, 2, 3], seed=seed), n)
    return [chat.episode_ids(d.messages, d.actions, d.observations) for d in demos]


def run(model, eps, bucket: int, steps: int, bf16: bool, batch: int = 16) -> tuple[float, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = bucketed_batches(iter(eps), batch, bucket, seed=0)
    real = total = 0
    elapsed = 0.0
    for i in range(steps + 1):
        b = collate(next(batches), 0)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**b).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i:  # the first step warms up allocators
            elapsed += time.perf_counter() - t0
            real += int(b["attention_mask"].sum())
            total += b["input_ids"].numel()
    return real / elapsed, 1 - real / total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "proto"], choices=sorted(SIZES))
    ap.add_argument("--bf16", choices=["both", "off", "on"], default="both")
    args = ap.parse_args()
    texts = [d.text() for d in itertools.islice(demo_stream(FAMILIES, [0, 1, 2, 3], seed=1), 1000)]
    chat = ChatFormat(train_tokenizer(texts))
    eps = episodes(chat, 16 * 32 * 2, seed=2)
    modes = {"both": [False, True], "off": [False], "on": [True]}[args.bf16]
    print(f"{'size':6} {'params':>8} {'thr':>3} {'bf16':>5} {'batches':>8} {'tok/s':>7} {'padding':>7}")
    for size, threads, bf16 in itertools.product(args.sizes, args.threads, modes):
        torch.set_num_threads(threads)
        for bucket, label in ((32, "bucket"), (1, "unsorted")):
            model = build_model(SIZES[size], seed=0)
            rate, pad = run(model, eps, bucket, args.steps, bf16)
            print(f"{size:6} {n_params(model):8d} {threads:3d} {bf16!s:>5} {label:>8} {rate:7.0f} {pad:7.1%}",
                  flush=True)


if __name__ == "__main__":
    main()
