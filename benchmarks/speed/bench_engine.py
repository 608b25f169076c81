"""HF engine throughput, and K continuations from one prefix vs re-encoding it per sample.

    PYTHONPATH=. python benchmarks/speed/bench_engine.py [--model DIR] [--k 8] [--prefix-tokens 400]

Figures (printed, not asserted):

* batched sampling tokens/s: ``--prompts`` chat prompts x ``--n`` samples, ``--new-tokens`` each
  (stop tokens disabled so every row generates the full length);
* K continuations from a ``--prefix-tokens`` long context (a multi-turn episode in progress):
  shared prefix (encode once, repeat the KV cache) vs the plain path (prefix re-encoded for
  every sample, batched) vs ``model.generate(num_return_sequences=K)``; first ``--cont-tokens``
  tokens each, then (``natural stops``) the context cut at its last turn boundary and every
  continuation ending at its action boundary (as long as the policy makes it there).

Times are the best of ``--repeats``: wall clock and this process's CPU time (one torch thread,
so CPU time is the single-core time, unaffected by other jobs waiting for the shared cores).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _policy
from _policy import bench_policy  # noqa: E402

from trace_core.engines.base import GenRequest  # noqa: E402
from trace_core.engines.config import SamplingConfig  # noqa: E402
from trace_core.engines.hf import HFEngine  # noqa: E402
from trace_core.envs import make_env  # noqa: E402
from trace_core.envs.synthetic import demonstration, generate_tasks  # noqa: E402


def best_of(fn, repeats: int) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds) over ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def best_of_pair(fa, fb, repeats: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """``best_of`` for two functions, called alternately so that a change of load hits both."""
    a, b = [], []
    for _ in range(repeats):
        a.append(best_of(fa, 1))
        b.append(best_of(fb, 1))
    return (min(x[0] for x in a), min(x[1] for x in a)), (min(x[0] for x in b), min(x[1] for x in b))


def long_prefix(chat, tokens: int, at_turn: bool = False) -> tuple[int, ...]:
    """A multi-turn episode context (prompt, demonstrated tool calls, observations) cut to
    ``tokens`` (``at_turn``: to the last observation's end within them); turns of further tasks
    are appended when one episode is shorter (a long agentic context, as real multi-hop
    episodes with large models have)."""
    env = make_env("qa")
    ids: list[int] = []
    turn_ends: list[int] = []
    for task in generate_tasks("qa", 200, 3, seed=1):
        ep = env.reset(task)
        ids = ids or chat.prompt_ids(ep.messages())
        for act in demonstration(task):
            step = ep.step(act)
            if step.done:
                break
            a = chat.encode(act)
            ids += a + chat.observation_ids(step.observation or "", action_closed=chat.ends_closed(a))
            turn_ends.append(len(ids))
        if len(ids) >= tokens:
            break
    if at_turn:
        tokens = max(e for e in turn_ends if e <= tokens)
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
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, chat, what = bench_policy(args.model)
    model.eval()
    print(f"policy: {what}; {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params; threads={args.threads}")
    stops = chat.stop_token_ids
    chat.stop_token_ids = set()  # run full lengths so tokens/s is over a known count

    env = make_env("math")
    tasks = generate_tasks("math", args.prompts, 1, seed=0)
    reqs = [GenRequest(tuple(chat.prompt_ids(env.reset(t).messages())), n=args.n, seed=i) for i, t in enumerate(tasks)]
    s = SamplingConfig(max_new_tokens=args.new_tokens, seed=0)
    eng = HFEngine(model, chat)
    eng.generate(reqs[:1], s)  # warm-up
    sec, cpu = best_of(lambda: eng.generate(reqs, s), args.repeats)
    n_tok = args.prompts * args.n * args.new_tokens
    print(f"hf engine sampling: {args.prompts} prompts x {args.n} samples x {args.new_tokens} tokens = {n_tok} tokens "
          f"in {sec:.2f} s wall ({cpu:.2f} s CPU) -> {n_tok / sec:,.0f} tokens/s ({n_tok / cpu:,.0f} per CPU second)")

    prefix = long_prefix(chat, args.prefix_tokens)
    req = [GenRequest(prefix, n=args.k, seed=1)]
    s = SamplingConfig(max_new_tokens=args.cont_tokens, seed=0)
    shared, plain = best_of_pair(lambda: HFEngine(model, chat, share_prefix=True).generate(req, s),
                                 lambda: HFEngine(model, chat, share_prefix=False).generate(req, s), args.repeats)
    ids = torch.tensor([prefix])

    def ms(t: tuple[float, float]) -> str:
        return f"{t[0] * 1000:7.1f} ms wall {t[1] * 1000:7.1f} ms CPU"

    def x(a: tuple[float, float], b: tuple[float, float]) -> str:
        return f"{a[0] / b[0]:.2f}x wall, {a[1] / b[1]:.2f}x CPU"

    def hf_generate():
        with torch.inference_mode():
            model.generate(ids, do_sample=True, top_k=0, num_return_sequences=args.k, max_new_tokens=args.cont_tokens,
                           min_new_tokens=args.cont_tokens, pad_token_id=chat.pad_token_id)

    gen = best_of(hf_generate, args.repeats)
    print(f"K={args.k} continuations x {args.cont_tokens} tokens from one {len(prefix)}-token prefix:")
    print(f"  shared prefix (encode once, repeat KV): {ms(shared)}")
    print(f"  re-encode per sample (batched plain):   {ms(plain)}  -> shared is {x(plain, shared)} faster")
    print(f"  transformers generate(num_return_sequences={args.k}): {ms(gen)}  -> {x(gen, shared)}")

    chat.stop_token_ids = stops
    prefix = long_prefix(chat, args.prefix_tokens, at_turn=True)
    req = [GenRequest(prefix, n=args.k, seed=1)]
    s = SamplingConfig(max_new_tokens=48, seed=0)  # the tiny config's action limit
    lens = [len(r.token_ids) for r in HFEngine(model, chat).generate(req, s)[0]]
    shared, plain = best_of_pair(lambda: HFEngine(model, chat, share_prefix=True).generate(req, s),
                                 lambda: HFEngine(model, chat, share_prefix=False).generate(req, s), args.repeats)
    print(f"natural stops: K={args.k} actions from a {len(prefix)}-token context (ends of a turn), "
          f"{sum(lens) / len(lens):.1f} tokens each (max {max(lens)}):")
    print(f"  shared prefix: {ms(shared)}; re-encode per sample: {ms(plain)}  -> {x(plain, shared)} faster")


if __name__ == "__main__":
    main()
