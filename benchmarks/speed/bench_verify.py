"""Verification throughput: answers checked per second, per task family (single CPU thread).

    PYTHONPATH=. python benchmarks/speed/bench_verify.py [--n 100000]

* math: ``check_math(pred, gold)`` over a mix of answer forms (plain, boxed, units, separators,
  fractions, wrong, garbage) for synthetic golds.
* qa:   ``check_qa(pred, golds)`` (normalised EM + token F1) for synthetic answers and variants.
* fc:   BFCL AST rule + JSON Schema validation of each predicted call (static tasks), and the
  sandbox final-state / answer check.
* episodes: full demo replays through ``env.reset`` + ``step`` (parse, tool, verify), per second.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from trace_core.envs import make_env, replay
from trace_core.envs.fc.check import ast_match, schema_error, to_json_schema
from trace_core.envs.math.answers import check_math
from trace_core.envs.qa.answers import check_qa
from trace_core.envs.synthetic import demonstration, generate_tasks


def _rate(fn, items) -> float:
    t = time.perf_counter()
    for it in items:
        fn(*it)
    return len(items) / (time.perf_counter() - t)


def math_items(n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    golds = [t.payload["answer"] for d in range(4) for t in generate_tasks("math", 250, d, 0)]
    forms = [lambda g: g, lambda g: f"\\boxed{{{g}}}", lambda g: f"{int(g):,} dollars", lambda g: f"{g}.0",
             lambda g: str(int(g) + 1), lambda g: f"{g}/1", lambda g: "I don't know", lambda g: f"$ {g}"]
    out = []
    for i in range(n):
        g = golds[i % len(golds)]
        out.append((forms[int(rng.integers(len(forms)))](g), g))
    return out


def qa_items(n: int, rng: np.random.Generator) -> list[tuple[str, list[str]]]:
    golds = [t.payload["answers"][0] for d in range(4) for t in generate_tasks("qa", 250, d, 0)]
    forms = [lambda g: g, lambda g: g.lower() + ".", lambda g: f"the {g}", lambda g: g.split()[0], lambda g: "Pardo"]
    picks = rng.integers(len(forms), size=n)
    return [(forms[k](golds[i % len(golds)]), [golds[i % len(golds)]]) for i, k in enumerate(picks)]


GT = [{"currency_convert": {"amount": [50], "from_currency": ["EUR", "euro"], "to_currency": ["JPY", "yen"]}}]
SCHEMA = to_json_schema({"type": "dict", "required": ["amount", "from_currency", "to_currency"], "properties": {
    "amount": {"type": "integer"}, "from_currency": {"type": "string"}, "to_currency": {"type": "string"}}})


def fc_items(n: int, rng: np.random.Generator) -> list[tuple[list, list]]:
    variants = [{"amount": 50, "from_currency": "euro", "to_currency": "Yen"},
                {"amount": 60, "from_currency": "EUR", "to_currency": "JPY"},
                {"amount": 50, "from_currency": "EUR"}, {"amount": "50", "to_currency": "JPY", "x": 1}]
    return [([("currency_convert", variants[int(rng.integers(len(variants)))])], GT) for _ in range(n)]


def fc_check(calls, gt):
    valid = [(n, a) for n, a in calls if schema_error(SCHEMA, a) is None]
    return ast_match(valid, gt)


def episode_rate(family: str, n_tasks: int) -> float:
    env = make_env(family)
    tasks = [t for d in range(4) for t in generate_tasks(family, n_tasks // 4, d, 1)]
    demos = [demonstration(t) for t in tasks]
    t0 = time.perf_counter()
    for t, d in zip(tasks, demos, strict=True):
        replay(env, t, d)
    return len(tasks) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000, help="answers per family")
    ap.add_argument("--episodes", type=int, default=2_000, help="demo episodes per family")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"verification throughput, {args.n} answers per family (answers/s, one thread)")
    print(f"  math  check_math            {_rate(check_math, math_items(args.n, rng)):>12,.0f}")
    print(f"  qa    check_qa (EM + F1)    {_rate(check_qa, qa_items(args.n, rng)):>12,.0f}")
    print(f"  fc    schema + AST rule     {_rate(fc_check, fc_items(args.n, rng)):>12,.0f}")
    print(f"full episodes (reset + demo replay incl. tools), {args.episodes} per family (episodes/s)")
    for fam in ("math", "qa", "fc"):
        print(f"  {fam:<5} {episode_rate(fam, args.episodes):>12,.0f}")


if __name__ == "__main__":
    main()
