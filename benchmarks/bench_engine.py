"""HF engine throughput, and K continuations from one prefix vs re-encoding it per sample.

    PYTHONPATH=. python benchmarks/bench_engine.py [--model DIR] [--k 8] [--prefix-tokens 400]

Figures (printed, not asserted):

* batched sampling tokens/s: ``--prompts`` chat prompts x ``--n`` samples, ``--new-tokens`` each
  (stop tokens disabled so every row generates the full length);
* K continuations from a ``--prefix-tokens`` long context (a multi-turn episode in progress):
  shared prefix (encode once, repeat the KV cache) vs the plain path (prefix re-encoded for
  every sample, batched) vs ``model.generate(num_return_sequences=K)``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _policy import bench_policy  # noqa: E402

from trace_core.engines.base import GenRequest, SamplingConfig  # noqa: E402
from trace_core.engines.hf import HFEngine  # noqa: E402
from trace_core.envs import make_env  # noqa: E402
from trace_core.envs.synthetic import demonstration, generate_tasks  # noqa: E402


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def long_prefix(chat, tokens: int) -> tuple[int, ...]:
    """A multi-turn episode context (prompt, demonstrated tool calls, observations) cut to
    ``tokens``; turns of further tasks are appended when one episode is shorter (a long agentic
    context, as real multi-hop episodes with large models have)."""
    env = make_env("qa")
    ids: list[int] = []
    for task in generate_tasks("qa", 200, 3, seed=1):
        ep = env.reset(task)
        ids = ids or chat.prompt_ids(ep.messages())
        for act in demonstration(task):
            step = ep.step(act)
            if step.done:
                break
            a = chat.encode(act)
            ids += a + chat.observation_ids(step.observation or "", action_closed=chat.ends_closed(a))
        if len(ids) >= tokens:
            break
    return tuple(ids[:tokens])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir (default: shipped tiny-warm, else random init)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=400)
    ap.add_argument("--cont-tokens", type=int, default=24, help="tokens per continuation (one short action)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, chat, what = bench_policy(args.model)
    model.eval()
    print(f"policy: {what}; {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params; threads={args.threads}")
    chat.stop_token_ids = set()  # run full lengths so tokens/s is over a known count

    env = make_env("math")
    tasks = generate_tasks("math", args.prompts, 1, seed=0)
    reqs = [GenRequest(tuple(chat.prompt_ids(env.reset(t).messages())), n=args.n, seed=i) for i, t in enumerate(tasks)]
    s = SamplingConfig(max_new_tokens=args.new_tokens, seed=0)
    eng = HFEngine(model, chat)
    eng.generate(reqs[:1], s)  # warm-up
    sec = best_of(lambda: eng.generate(reqs, s), args.repeats)
    n_tok = args.prompts * args.n * args.new_tokens
    print(f"hf engine sampling: {args.prompts} prompts x {args.n} samples x {args.new_tokens} tokens = {n_tok} tokens "
          f"in {sec:.2f} s -> {n_tok / sec:,.0f} tokens/s")

    prefix = long_prefix(chat, args.prefix_tokens)
    req = [GenRequest(prefix, n=args.k, seed=1)]
    s = SamplingConfig(max_new_tokens=args.cont_tokens, seed=0)
    shared = best_of(lambda: HFEngine(model, chat, share_prefix=True).generate(req, s), args.repeats)
    plain = best_of(lambda: HFEngine(model, chat, share_prefix=False).generate(req, s), args.repeats)
    ids = torch.tensor([prefix])

    def hf_generate():
        with torch.inference_mode():
            model.generate(ids, do_sample=True, top_k=0, num_return_sequences=args.k, max_new_tokens=args.cont_tokens,
                           min_new_tokens=args.cont_tokens, pad_token_id=chat.pad_token_id)

    gen = best_of(hf_generate, args.repeats)
    print(f"K={args.k} continuations x {args.cont_tokens} tokens from one {len(prefix)}-token prefix:")
    print(f"  shared prefix (encode once, repeat KV): {shared * 1000:8.1f} ms")
    print(f"  re-encode per sample (batched plain):  {plain * 1000:8.1f} ms  -> shared is {plain / shared:.2f}x faster")
    print(f"  transformers generate(num_return_sequences={args.k}): {gen * 1000:8.1f} ms  -> {gen / shared:.2f}x")


if __name__ == "__main__":
    main()
