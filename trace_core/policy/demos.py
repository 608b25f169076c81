"""Correct demonstration episodes from the synthetic generators, as text and as token ids.

A demonstration is run through the real environment so that its observations are exactly
what the policy will later see, and it is kept only if the environment rewards it (1.0).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from trace_core.envs import make_env
from trace_core.envs.base import Task
from trace_core.envs.synthetic import demonstration, generate_tasks
from trace_core.policy.chat import ChatFormat


@dataclass(frozen=True)
class Demo:
    """One correct episode: initial messages, the actions and the observations between them."""

    task: Task
    messages: list[dict[str, str]]
    actions: list[str]
    observations: list[str]  # len(actions) - 1: the last action is the answer

    def text(self) -> str:
        """The whole episode as chat text (tokenizer corpus)."""
        out = ChatFormat.prompt_text(self.messages)
        for t, a in enumerate(self.actions):
            out += a
            if t < len(self.observations):
                out += ChatFormat.observation_text(self.observations[t])
        return out


def run_demo(task: Task, env) -> Demo | None:
    """Play ``demonstration(task)`` in ``env``; None unless it ends with reward 1."""
    ep = env.reset(task)
    actions = list(demonstration(task))
    observations: list[str] = []
    for t, action in enumerate(actions):
        res = ep.step(action)
        if res.done:
            ok = t == len(actions) - 1 and res.reward >= 1.0
            return Demo(task, ep.messages(), actions, observations) if ok else None
        observations.append(res.observation or "")
    return None


def cell_tasks(family: str, difficulty: int, n: int, seed: int) -> list[Task]:
    """``n`` generator tasks of one (family, difficulty) cell; the seed makes them reproducible."""
    return list(generate_tasks(family, n, difficulty, seed))


def demo_stream(
    families: dict[str, float],
    difficulties: list[int],
    seed: int,
    *,
    chunk: int = 64,
    env_kwargs: dict | None = None,
) -> Iterator[Demo]:
    """An endless, reproducible stream of correct demos over the family / difficulty mix.

    Each chunk draws one (family, difficulty) cell per task from ``seed``'s generator (family
    by weight, difficulty uniform) and generates that cell's tasks with a derived seed.
    """
    names = sorted(k for k, w in families.items() if w > 0)
    weights = np.array([families[k] for k in names], dtype=float)
    weights /= weights.sum()
    envs = {f: make_env(f, **(env_kwargs or {})) for f in names}
    rng = np.random.default_rng(seed)
    while True:
        fam_idx = rng.choice(len(names), size=chunk, p=weights)
        diffs = rng.choice(difficulties, size=chunk)
        cells: dict[tuple[str, int], int] = {}
        for f, d in zip(fam_idx, diffs, strict=True):
            key = (names[int(f)], int(d))
            cells[key] = cells.get(key, 0) + 1
        out: list[Demo] = []
        for (fam, diff), n in sorted(cells.items()):
            cell_seed = int(rng.integers(2**31))
            for task in cell_tasks(fam, diff, n, cell_seed):
                demo = run_demo(task, envs[fam])
                if demo is not None:
                    out.append(demo)
        order = rng.permutation(len(out))
        for i in order:
            yield out[int(i)]
