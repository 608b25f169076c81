"""Synthetic tasks and demonstration traces for every family, through the family registries
(``trace_core.envs.families``; each family package registers its generator and writer).

``generate_tasks(family, n, difficulty, seed) -> list[Task]``: task ``i`` depends only on
``(family, difficulty, seed, i)`` (its own ``np.random.Generator``), so a longer list extends a
shorter one; ``prompt_id = f"{family}-d{difficulty}-s{seed}-{i}"``.

``demonstration(task) -> list[str]``: the correct assistant turns, each ending in
``</tool_call>`` or ``</answer>`` with no thought text. Replaying them through the family's env
gives reward 1.0. It reads the task payload, so it also works for loaded records that carry a
worked solution (GSM8K ``<<...>>`` steps, HotpotQA / MuSiQue supporting titles, BFCL ground truth).
"""

from __future__ import annotations

import numpy as np

from trace_core.envs.base import Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.families import DEMONSTRATIONS, GENERATORS

DIFFICULTIES = (0, 1, 2, 3)


def generate_tasks(family: str, n: int, difficulty: int, seed: int) -> list[Task]:
    """``n`` tasks of one family and level, deterministic in ``seed``."""
    gen = GENERATORS.get_item(family)
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be in {DIFFICULTIES}, got {difficulty}")
    return [
        gen.make(np.random.default_rng([gen.salt, difficulty, seed, i]), difficulty,
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
    """Correct action strings for ``task``, by its family's registered writer (KeyError for an
    unknown family; the writer raises when the payload carries no solution)."""
    return DEMONSTRATIONS.get_item(task.family)(task)
