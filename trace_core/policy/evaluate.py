"""Sampled success of a policy on held-out generator tasks: the warm-start success table.

Episodes run through the one agent loop (``trace_core.rollout.agent_loop.evaluate_rewards``); this module
picks the held-out tasks and summarises rewards per (family, difficulty) cell, with the share
of samples in mixed-outcome groups. ``record_success`` measures a checkpoint with the ``hf``
engine and true temperature sampling (temperature 1, no top-k / top-p).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trace_core.engines.config import SamplingConfig
from trace_core.engines.hf import HFEngine
from trace_core.envs import make_env
from trace_core.envs.base import Task
from trace_core.policy.chat import ChatFormat
from trace_core.policy.demos import cell_tasks
from trace_core.policy.model import load_policy
from trace_core.rollout.agent_loop import RolloutConfig, evaluate_rewards

#: Seed offset of held-out tasks: training demos draw cell seeds below 2**31 from their own
#: stream; evaluation uses a disjoint, fixed seed family per cell.
HELDOUT_SEED = 1_000_003


def heldout_tasks(families: Sequence[str], difficulties: Sequence[int], n_per_cell: int, seed: int = 0) -> list[Task]:
    """``n_per_cell`` fresh generator tasks for every (family, difficulty) cell."""
    tasks: list[Task] = []
    for f_i, fam in enumerate(families):
        for diff in difficulties:
            tasks += cell_tasks(fam, int(diff), n_per_cell, HELDOUT_SEED + 1000 * seed + 10 * f_i + int(diff))
    return tasks


def policy_rewards(model: Any, tokenizer: Any, tasks: Sequence[Task], n: int, *, seed: int = 0,
                   max_new_tokens: int = 96, env_kwargs: dict | None = None) -> np.ndarray:
    """Rewards ``(len(tasks), n)`` of a loaded HF model, measured as the success table is: the
    ``hf`` engine, temperature 1 with no top-k / top-p, through ``rollout.evaluate_rewards``."""
    chat = ChatFormat(tokenizer)
    envs = {f: make_env(f, **(env_kwargs or {})) for f in sorted({t.family for t in tasks})}
    sampling = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed)
    # the env's own turn / token limits end episodes; the loop only guards the model's positions
    loop = RolloutConfig(max_turns=256, progress=False,
                         max_context_tokens=model.config.max_position_embeddings - max_new_tokens)
    return evaluate_rewards(HFEngine(model, chat), chat, envs, tasks, n, sampling=sampling, cfg=loop, seed=seed)


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
    ckpt = Path(ckpt_dir)
    model, tokenizer = load_policy(ckpt)
    tasks = heldout_tasks(families, difficulties, n_per_cell, seed)
    t0 = time.perf_counter()
    rewards = policy_rewards(model, tokenizer, tasks, n, seed=seed, max_new_tokens=max_new_tokens, env_kwargs=env_kwargs)
    table = success_table(tasks, rewards)
    table["measured"] = {"n_per_cell": n_per_cell, "n": n, "seed": seed, "temperature": 1.0, "top_k": 0,
                         "max_new_tokens": max_new_tokens, "heldout_seed": HELDOUT_SEED,
                         "loop": "trace_core.rollout.agent_loop.evaluate_rewards",
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
