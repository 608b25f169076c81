"""The reference score of a candidate prompt: how likely the current policy finds its worked
solution, ranked among the candidates of its (family, difficulty) cell.

Nothing else the predictor sees orders the prompts it has never sampled: not the cell, not the
hashed text, not the warm policy's hidden state (docs/experiments.md, point 15). The policy's own
log-probability of the task's demonstration (``envs.synthetic.demonstration``, played through the
environment so the observations are the ones the policy will see) does: on the 256 training
prompts of ``configs/learning-epochs-192.yaml`` under the shipped policy, its within-cell Spearman
correlation with the 16-sample success rate is 0.76 for QA, 0.50 for math, 0.51 for function
calling (``benchmarks/learning/reference_probe.py``). It costs one forward pass (no sampling) per
candidate with a demonstration.

``reference_scores`` is stage 2's side: the mean log-probability per action token of each
candidate's demonstration under the checkpoint the rollouts will use (at the sampling
temperature), turned into a within-cell rank in [-0.5, 0.5] (0 for a lone candidate; null for a
task without a demonstration). The rank, not the raw value, is what the predictor learns from: the
scale of a log-probability differs by family and drifts as the policy sharpens. The prompts shard
records it (``prompts.ref_score``); ``with_reference_scores`` puts the recorded scores back on the
history's roots for the predictor's refresh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
import torch
from scipy.stats import rankdata

from trace_core.envs.base import Env, Task
from trace_core.policy.demos import run_demo
from trace_core.stages.history import history_prompts
from trace_core.stages.run import RunRef


def demo_ids(task: Task, env: Env, chat, max_tokens: int) -> tuple[list[int], list[int]] | None:
    """``(input_ids, action_mask)`` of ``task``'s demonstration played in ``env``, or None where
    the task has none, the environment does not reward it, or it is longer than ``max_tokens``."""
    try:
        demo = run_demo(task, env)
    except (KeyError, ValueError):  # no writer for the family, or no solution in the payload
        return None
    if demo is None:
        return None
    ids, mask = chat.episode_ids(demo.messages, demo.actions, demo.observations)
    return (ids, mask) if len(ids) <= max_tokens and any(mask) else None


@torch.no_grad()
def demo_logprobs(model, episodes: Sequence[tuple[list[int], list[int]] | None], pad_id: int, *,
                  temperature: float = 1.0, batch: int = 32) -> np.ndarray:
    """``(n,)`` mean log-probability per action token of each episode under ``model`` (NaN for None)."""
    out = np.full(len(episodes), np.nan)
    todo = [i for i, e in enumerate(episodes) if e is not None]
    todo.sort(key=lambda i: len(episodes[i][0]))  # similar lengths together: little padding
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(todo), batch):
            rows = todo[s : s + batch]
            width = max(len(episodes[i][0]) for i in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            att = torch.zeros((len(rows), width), dtype=torch.long)
            act = torch.zeros((len(rows), width), dtype=torch.bool)
            for b, i in enumerate(rows):
                e_ids, e_mask = episodes[i]
                ids[b, : len(e_ids)] = torch.tensor(e_ids)
                att[b, : len(e_ids)] = 1
                act[b, : len(e_ids)] = torch.tensor(e_mask, dtype=torch.bool)
            ids, att, act = ids.to(device), att.to(device), act.to(device)
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float() / max(temperature, 1e-6)
            tok = torch.log_softmax(logits, dim=-1).gather(2, ids[:, 1:, None])[..., 0]
            on = act[:, 1:]
            mean = (tok * on).sum(1) / on.sum(1).clamp_min(1)
            out[rows] = mean.cpu().numpy()
    finally:
        model.train(was_training)
    return out


def within_cell_rank(tasks: Sequence[Task], values: np.ndarray) -> np.ndarray:
    """``(n,)`` each finite value's rank among its (family, difficulty) cell's, scaled to
    [-0.5, 0.5] (ties share their mean rank; a lone value gets 0); NaN stays NaN."""
    out = np.full(len(tasks), np.nan)
    cells: dict[tuple[str, int], list[int]] = {}
    for i, t in enumerate(tasks):
        if np.isfinite(values[i]):
            cells.setdefault((t.family, t.difficulty), []).append(i)
    for rows in cells.values():
        if len(rows) == 1:
            out[rows[0]] = 0.0
            continue
        out[rows] = (rankdata(values[rows]) - 1.0) / (len(rows) - 1) - 0.5  # ties: their mean rank
    return out


def reference_scores(policy, tasks: Sequence[Task], envs: Mapping[str, Env], *, temperature: float,
                     max_tokens: int) -> np.ndarray:
    """``(n,)`` the within-cell rank of each candidate's demonstration log-probability under
    ``policy`` (a ``policy.live.Policy``); NaN where a task has no usable demonstration."""
    episodes = [demo_ids(t, envs[t.family], policy.chat, max_tokens) if t.family in envs else None for t in tasks]
    lp = demo_logprobs(policy.model, episodes, policy.chat.pad_token_id, temperature=temperature)
    return within_cell_rank(tasks, lp)


def with_reference_scores(nodes: pl.DataFrame, ref: RunRef, before: int) -> pl.DataFrame:
    """``nodes`` with a ``ref_score`` column: on roots, the score stage 2 recorded for that prompt
    and iteration (the prompts shards of iterations ``< before``); null elsewhere."""
    prompts = history_prompts(ref, before)
    if "ref_score" in nodes.columns:
        nodes = nodes.drop("ref_score")
    if "ref_score" not in prompts.columns or prompts.height == 0 or nodes.height == 0:
        return nodes.with_columns(pl.lit(None, dtype=pl.Float64).alias("ref_score"))
    scores = prompts.select(pl.col("iteration").cast(pl.Int64), "prompt_id", pl.col("ref_score").cast(pl.Float64))
    joined = nodes.with_columns(pl.col("iteration").cast(pl.Int64).alias("_it")).join(
        scores.rename({"iteration": "_it"}), on=["_it", "prompt_id"], how="left").drop("_it")
    return joined.with_columns(pl.when(pl.col("depth") == 0).then(pl.col("ref_score")).alias("ref_score"))
