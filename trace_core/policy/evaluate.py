"""Sampled success of a policy on held-out generator tasks: the warm-start success table.

A plain turn loop over the ``hf`` engine (true temperature sampling, no top-k): the first
turn of a task's ``n`` samples shares one encoded prompt; later turns continue each episode.
For the full agent loop with node records use ``trace_core.rollout``; this module only needs
rewards, per (family, difficulty) cell, and the share of samples in mixed-outcome groups.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trace_core.envs.base import Task
from trace_core.policy.chat import ChatFormat

#: Seed offset of held-out tasks: training demos draw cell seeds below 2**31 from their own
#: stream; evaluation uses a disjoint, fixed seed family per cell.
HELDOUT_SEED = 1_000_003


def heldout_tasks(families: Sequence[str], difficulties: Sequence[int], n_per_cell: int, seed: int = 0) -> list[Task]:
    """``n_per_cell`` fresh generator tasks for every (family, difficulty) cell."""
    from trace_core.policy.demos import cell_tasks

    tasks: list[Task] = []
    for f_i, fam in enumerate(families):
        for diff in difficulties:
            tasks += cell_tasks(fam, int(diff), n_per_cell, HELDOUT_SEED + 1000 * seed + 10 * f_i + int(diff))
    return tasks


def sample_rewards(
    model: Any, tokenizer: Any, tasks: list[Task], n: int, *, seed: int = 0, temperature: float = 1.0,
    max_new_tokens: int = 96, env_kwargs: dict | None = None,
) -> np.ndarray:
    """Rewards ``(len(tasks), n)`` of ``n`` sampled episodes per task (temperature sampling)."""
    from trace_core.engines.base import GenRequest, SamplingConfig
    from trace_core.engines.hf import HFEngine
    from trace_core.envs import make_env

    chat = ChatFormat(tokenizer)
    engine = HFEngine(model, chat)
    sampling = SamplingConfig(temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed)
    envs = {f: make_env(f, **(env_kwargs or {})) for f in {t.family for t in tasks}}
    rewards = np.zeros((len(tasks), n))
    episodes, ids = {}, {}
    prompts = []
    for i, task in enumerate(tasks):
        first = envs[task.family].reset(task)
        prompt = chat.prompt_ids(first.messages())
        prompts.append(GenRequest(prompt_ids=tuple(prompt), n=n, seed=i))
        for j in range(n):
            episodes[i, j] = first if j == 0 else envs[task.family].reset(task)
            ids[i, j] = list(prompt)
    results = engine.generate(prompts, sampling)
    outs = {(i, j): results[i][j] for i in range(len(tasks)) for j in range(n)}
    turn = 0
    while outs:
        nxt = []
        for (i, j), res in outs.items():
            step = episodes[i, j].step(res.text, n_tokens=len(res.token_ids))
            if step.done:
                rewards[i, j] = step.reward
                continue
            ids[i, j] += list(res.token_ids)
            ids[i, j] += chat.observation_ids(step.observation or "", action_closed=chat.ends_closed(res.token_ids))
            nxt.append((i, j))
        turn += 1
        reqs = [GenRequest(prompt_ids=tuple(ids[k]), n=1, seed=(turn * 1_000_003 + k[0]) * 64 + k[1]) for k in nxt]
        results = engine.generate(reqs, sampling) if reqs else []
        outs = {k: r[0] for k, r in zip(nxt, results, strict=True)}
    return rewards


def success_table(tasks: list[Task], rewards: np.ndarray) -> dict[str, Any]:
    """Per-cell success, overall success and the mixed share (samples in mixed groups).

    Returns ``{"cells": {"math/0": {"success": .., "mixed": .., "tasks": ..}, ...},
    "overall": .., "mixed_share": .., "n": n}``. A group is one task's ``n`` samples;
    ``mixed`` is the share of samples whose group holds both a success and a failure.
    """
    solved = rewards >= 1.0
    mixed = solved.any(axis=1) & ~solved.all(axis=1)
    cells: dict[str, dict[str, float]] = {}
    keys = sorted({(t.family, t.difficulty) for t in tasks})
    for fam, diff in keys:
        rows = [i for i, t in enumerate(tasks) if (t.family, t.difficulty) == (fam, diff)]
        cells[f"{fam}/{diff}"] = {"success": round(float(solved[rows].mean()), 4),
                                  "mixed": round(float(mixed[rows].mean()), 4), "tasks": len(rows)}
    return {"cells": cells, "overall": round(float(solved.mean()), 4),
            "mixed_share": round(float(mixed.mean()), 4), "n": int(rewards.shape[1])}


def format_table(table: dict[str, Any]) -> str:
    """Markdown: one row per family, one column per difficulty, ``success% (mixed%)``."""
    fams = sorted({k.split("/")[0] for k in table["cells"]})
    diffs = sorted({int(k.split("/")[1]) for k in table["cells"]})
    lines = ["| family | " + " | ".join(f"d{d}" for d in diffs) + " |",
             "|---|" + "---|" * len(diffs)]
    for fam in fams:
        cells = [table["cells"].get(f"{fam}/{d}") for d in diffs]
        lines.append(f"| {fam} | " + " | ".join(
            f"{c['success']:.0%} ({c['mixed']:.0%})" if c else "-" for c in cells) + " |")
    lines.append(f"\noverall success {table['overall']:.1%}; samples in mixed groups at n={table['n']}: "
                 f"{table['mixed_share']:.1%} (cells: success (mixed share))")
    return "\n".join(lines)


def record_success(
    ckpt_dir: str | Path, *, families: Sequence[str] = ("math", "qa", "fc"), difficulties: Sequence[int] = (0, 1, 2, 3),
    n_per_cell: int = 24, n: int = 8, seed: int = 0, max_new_tokens: int = 96, env_kwargs: dict | None = None,
) -> dict[str, Any]:
    """Measure the checkpoint's held-out success table and write it beside the weights.

    Adds ``success`` (the table plus how it was measured) to ``recipe.json`` and writes
    ``SUCCESS.md``. Returns the table.
    """
    from trace_core.policy.model import load_policy

    ckpt = Path(ckpt_dir)
    model, tokenizer = load_policy(ckpt)
    model.eval()
    tasks = heldout_tasks(families, difficulties, n_per_cell, seed)
    t0 = time.perf_counter()
    with torch.no_grad():
        rewards = sample_rewards(model, tokenizer, tasks, n, seed=seed, max_new_tokens=max_new_tokens,
                                 env_kwargs=env_kwargs)
    table = success_table(tasks, rewards)
    table["measured"] = {"n_per_cell": n_per_cell, "n": n, "seed": seed, "temperature": 1.0, "top_k": 0,
                         "max_new_tokens": max_new_tokens, "heldout_seed": HELDOUT_SEED,
                         "eval_s": round(time.perf_counter() - t0, 1)}
    recipe_path = ckpt / "recipe.json"
    recipe = json.loads(recipe_path.read_text()) if recipe_path.is_file() else {}
    recipe["success"] = table
    recipe_path.write_text(json.dumps(recipe, indent=2, sort_keys=True))
    write_success_md(ckpt)
    return table


def write_success_md(ckpt_dir: str | Path) -> str:
    """``SUCCESS.md`` beside the weights from the table and stages in ``recipe.json``."""
    ckpt = Path(ckpt_dir)
    recipe = json.loads((ckpt / "recipe.json").read_text())
    table, m = recipe["success"], recipe["success"]["measured"]
    stages = [*recipe.get("stages", []), recipe]
    lines = [f"- stage {i + 1}: {st.get('steps_done')} steps, families {st['warmup']['families']}, lr "
             f"{st['warmup']['lr']}, final loss {st.get('final_loss')}, {st.get('tokens')} tokens at "
             f"{st.get('tokens_per_s')} tokens/s ({st.get('train_s')} s), config hash {st.get('config_hash')}"
             + (f", from {st['warmup']['init_from']}" if st["warmup"].get("init_from") else ", from scratch")
             for i, st in enumerate(stages)]
    text = (f"# tiny-warm: held-out success after SFT warm start\n\n"
            f"{recipe.get('n_params')} parameters, sizes {json.dumps(recipe.get('model'))}.\n\n"
            + "\n".join(lines) + "\n\n"
            f"{m['n_per_cell']} held-out tasks per cell x {m['n']} samples (temperature 1, top_k 0, "
            f"max {m['max_new_tokens']} new tokens a turn), measured in {m['eval_s']} s.\n\n"
            + format_table(table) + "\n")
    (ckpt / "SUCCESS.md").write_text(text)
    return text
