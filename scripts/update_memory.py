"""The capacity plan's update formulas against measured peak RSS, on CPU at toy widths with
Qwen3's full 151,936-row vocabulary (random weights; one process, float32, as the update runs).

    python scripts/update_memory.py            # the default cases, one fresh process each
    python scripts/update_memory.py --quick    # three cases

Each case runs the real ``update_policy`` (2 optimizer steps of one micro-batch: the second runs
with the AdamW moments of the first in memory, the steady state) in its own process and reports
the peak RSS above the RSS before the model was built, beside ``trace_core.analysis.capacity``'s
prediction for the same shape; then the peak per 1k tokens at full vocabulary with and without
``logprob_chunk``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 151_936
# (hidden, layers, sequence length, logprob_chunk, gradient checkpointing); pairs at 1,024 and 2,048
# tokens give the peak's growth per 1k tokens with and without chunking
CASES = [(64, 2, 1024, 0, False), (128, 4, 512, 0, True), (128, 4, 1024, 0, True), (128, 4, 512, 128, True),
         (128, 4, 1024, 128, True), (256, 4, 1024, 128, True), (256, 8, 1024, 256, False), (512, 4, 512, 0, False)]
QUICK = [CASES[0], CASES[2], CASES[5]]
PAIRS = {"unchunked": (CASES[1], CASES[2]), "chunk 128": (CASES[3], CASES[4])}
MICRO = 2  # sequences per micro-batch


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(hidden: int, layers: int, length: int, chunk: int, ckpt: bool) -> dict:
    """One case in this process: peak RSS (bytes) of model + optimizer + 2 update steps."""
    import resource

    import torch
    import transformers  # noqa: F401  (imported before the baseline, as in a run)

    from trace_core.policy.config import ModelConfig, UpdateConfig
    from trace_core.policy.model import build_model
    from trace_core.policy.update import TrainSequence, make_optimizer, update_policy

    torch.set_num_threads(1)
    base = _rss_kib()
    mcfg = ModelConfig(hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
                       intermediate_size=3 * hidden, vocab_size=VOCAB, tie_embeddings=False)
    model = build_model(mcfg)
    ucfg = UpdateConfig(minibatch_size=MICRO, micro_batch_size=MICRO, gradient_checkpointing=ckpt,
                        logprob_chunk=chunk, skip_zero_advantage=False)
    opt, sched = make_optimizer(model, ucfg)
    rng = torch.Generator().manual_seed(0)
    seqs = [TrainSequence(input_ids=torch.randint(0, VOCAB, (length,), generator=rng).tolist(),
                          loss_mask=[1] * length, advantages=[1.0] * length, old_logprobs=[-12.0] * length)
            for _ in range(2 * MICRO)]
    update_policy(model, opt, sched, seqs, ucfg, pad_id=0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"measured": (peak - base) * 1024, "head_dim": mcfg.head_dim}


def predict(hidden: int, layers: int, length: int, chunk: int, ckpt: bool) -> float:
    from trace_core.analysis.capacity import Shape, update_memory

    shape = Shape(hidden, layers, 4, 2, hidden // 4, 3 * hidden, VOCAB, False)
    return update_memory(shape, tokens=MICRO * length, micro_batch=MICRO, world_size=1, strategy="single",
                         checkpointing=ckpt, chunk=chunk).peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="three cases only")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a case as JSON, measured in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(*json.loads(args.one))))
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    print(f"{'hidden':>6} {'layers':>6} {'tokens':>6} {'chunk':>5} {'ckpt':>4} {'predicted MiB':>13} "
          f"{'measured MiB':>12} {'error':>6}  MiB/1k tokens")
    worst, measured = 0.0, {}
    for case in QUICK if args.quick else CASES:
        out = subprocess.run([sys.executable, __file__, "--one", json.dumps(case)], env=env, capture_output=True,
                             text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])["measured"]
        want = predict(*case)
        measured[case] = got
        err = want / got - 1
        worst = max(worst, abs(err))
        h, layers, length, chunk, ckpt = case
        print(f"{h:>6} {layers:>6} {MICRO * length:>6} {chunk:>5} {'on' if ckpt else 'off':>4} "
              f"{want / 2**20:>13.0f} {got / 2**20:>12.0f} {err:>+6.0%}  {got / 2**20 / (MICRO * length / 1000):.0f}",
              flush=True)
    print(f"worst error {worst:.0%} (model + AdamW + 2 steps of one {MICRO}-sequence micro-batch, float32, 1 process)")
    for name, (a, b) in PAIRS.items():
        if a in measured and b in measured:
            per_1k = (measured[b] - measured[a]) / (MICRO * (b[2] - a[2]) / 1000) / 2**20
            print(f"peak RSS growth per 1k tokens at vocabulary {VOCAB:,} (hidden {a[0]}, {a[1]} layers, "
                  f"checkpointing on), {name}: {per_1k:.0f} MiB")


if __name__ == "__main__":
    main()
