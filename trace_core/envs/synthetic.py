"""Synthetic task generators (registry) and demonstration traces for every family.

``generate_tasks(family, n, difficulty, seed) -> list[Task]``: task ``i`` depends only on
``(family, difficulty, seed, i)`` (its own ``np.random.Generator``), so a longer list extends a
shorter one; ``prompt_id = f"{family}-d{difficulty}-s{seed}-{i}"``.

``demonstration(task) -> list[str]``: the correct assistant turns, each ending in
``</tool_call>`` or ``</answer>`` with no thought text. Replaying them through the family's env
gives reward 1.0. It reads the task payload, so it also works for loaded records that carry a
worked solution (GSM8K ``<<...>>`` steps, HotpotQA / MuSiQue supporting titles, BFCL ground truth).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trace_core.envs.actions import format_answer, format_call
from trace_core.envs.base import Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.gen_fc import make_fc_task
from trace_core.envs.gen_math import make_math_task
from trace_core.envs.gen_qa import make_qa_task

Generator = Callable[[np.random.Generator, int, str], Task]
GENERATORS: dict[str, Generator] = {}
_SALT: dict[str, int] = {}


def register_generator(family: str, salt: int) -> Callable[[Generator], Generator]:
    """Add a generator; ``salt`` separates the random streams of families."""

    def deco(fn: Generator) -> Generator:
        if family in GENERATORS:
            raise ValueError(f"generator {family!r} already registered")
        GENERATORS[family], _SALT[family] = fn, salt
        return fn

    return deco


register_generator("math", 1)(make_math_task)
register_generator("qa", 2)(make_qa_task)
register_generator("fc", 3)(make_fc_task)

DIFFICULTIES = (0, 1, 2, 3)


def generate_tasks(family: str, n: int, difficulty: int, seed: int) -> list[Task]:
    """``n`` tasks of one family and level, deterministic in ``seed``."""
    if family not in GENERATORS:
        raise KeyError(f"unknown family {family!r}; known: {sorted(GENERATORS)}")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be in {DIFFICULTIES}, got {difficulty}")
    make = GENERATORS[family]
    return [
        make(np.random.default_rng([_SALT[family], difficulty, seed, i]), difficulty,
             f"{family}-d{difficulty}-s{seed}-{i}")
        for i in range(n)
    ]


def sample_tasks(cfg: EnvConfig, n: int, seed: int) -> list[Task]:
    """A candidate pool of ``n`` tasks mixing families by ``cfg.families`` weights and levels
    uniformly over ``cfg.difficulties``; deterministic in ``seed``. prompt_ids stay unique."""
    rng = np.random.default_rng([seed, 7])
    fams = [f for f, w in cfg.families.items() if w > 0]
    w = np.array([cfg.families[f] for f in fams], dtype=float)
    fi = rng.choice(len(fams), size=n, p=w / w.sum())
    di = rng.choice(cfg.difficulties, size=n)
    counts: dict[tuple[str, int], int] = {}
    for f, d in zip(fi, di, strict=True):
        key = (fams[f], int(d))
        counts[key] = counts.get(key, 0) + 1
    pools = {k: iter(generate_tasks(k[0], c, k[1], seed)) for k, c in counts.items()}
    return [next(pools[(fams[f], int(d))]) for f, d in zip(fi, di, strict=True)]


def demonstration(task: Task) -> list[str]:
    """Correct action strings for ``task`` (ValueError when its payload carries no solution)."""
    p = task.payload
    if task.family == "math":
        calls = [format_call("calculator", {"expression": e}) for e in p.get("steps", [])]
        return calls + [format_answer(p["answer"])]
    if task.family == "qa":
        return [format_call("search", {"query": q}) for q in p.get("hops", [])] + [format_answer(p["answers"][0])]
    if task.family == "fc":
        if p.get("mode", "sandbox") == "sandbox":
            return [format_call(n, a) for n, a in p["calls"]] + [format_answer(p["answer"])]
        # static (BFCL / xLAM): first allowed value of each argument; '' (omit) is skipped.
        # The episode ends after the last ground-truth call, so no answer turn.
        out = []
        for entry in p["ground_truth"]:
            (fn, spec), = entry.items()
            args = {}
            for k, allowed in spec.items():
                given = [a for a in (allowed if isinstance(allowed, list) else [allowed]) if a != ""]
                if given:
                    args[k] = given[0]
            out.append(format_call(fn, args))
        return out
    raise ValueError(f"no demonstration for family {task.family!r}")
