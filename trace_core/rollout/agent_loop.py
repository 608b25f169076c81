"""The multi-turn agent loop: raw rollouts, extensions from prefix nodes and evaluation alike.

One code path (``run_episodes``) advances a batch of live episodes turn by turn::

    generate (all live episodes at once) -> parse + tool (env.step) -> observation -> next turn

Episodes whose token context is identical at the start of a turn (the ``m`` raw rollouts of a
prompt, the ``K`` continuations of a prefix) are one engine request with ``n`` samples, so the
shared context is encoded once. Every turn becomes a ``NODE_SCHEMA`` row; the last turn of an
episode is a leaf with its reward and reason code. Node ids are
``node_id(run_id, iteration, prompt_id, path)``, so a re-run gives the same ids.

``evaluate_rewards`` plays held-out episodes through the same loop and keeps only the rewards.
An extension rebuilds the environment state with ``envs.base.replay`` on the prefix's actions
and its token context from the stored action ids and observations (exactly what the raw
rollout saw).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from trace_core import cancel
from trace_core.engines.base import Engine, GenRequest, GenResult
from trace_core.engines.config import SamplingConfig
from trace_core.envs.base import Env, Episode, Task, replay
from trace_core.nodes import finalize_tree, node_id, nodes_frame, path_to_root, root_rows, utc_now

TURN_LIMIT = "turn_limit"  # the loop's own safety limits (the env has its own, usually tighter)
CONTEXT_LIMIT = "context_limit"


class RolloutConfig(BaseModel):
    """Limits and display of the agent loop."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(8, ge=1, le=256, description="Turns after which an unfinished episode ends ('turn_limit').")
    max_context_tokens: int = Field(
        2048, ge=16, le=1_000_000,
        description="Episode length in tokens (prompt + actions + observations) that ends it ('context_limit'); "
        "keep it <= the model's max positions minus max_new_tokens.")
    progress: bool = Field(True, description="Show a tqdm bar (episodes, tokens/s) on long batches.")
    progress_min_episodes: int = Field(64, ge=1, description="Batches smaller than this run without a bar.")


@dataclass
class LiveEpisode:
    """An episode in flight. ``key`` seeds its samples; ``path`` prefixes its node paths."""

    task: Task
    episode: Episode
    context: list[int]  # token ids the next action continues
    parent_id: str
    trajectory_id: str
    path: str
    depth: int  # depth of the node the next turn creates, minus 1
    origin: str
    base: dict[str, Any]  # run_id, strategy, iteration copied into every row
    lp_sum: float = 0.0
    lp_n: int = 0
    lp_min: float = 0.0
    tool_errors: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


def _request_seed(seed: int, prompt_id: str, key: str, depth: int) -> int:
    """The sampling seed of one request: distinct per (prompt, path, depth), so rollout ``j`` of
    two prompts does not draw the same random stream."""
    return int(node_id(seed, f"{prompt_id}/{key}", depth), 16) >> 1


def _step_row(live: LiveEpisode, res: GenResult, seconds: float, sampling: SamplingConfig,
              cfg: RolloutConfig, chat: Any) -> dict[str, Any]:
    """Apply one generated action to ``live`` (env step, context, stats) and return its node row."""
    step = live.episode.step(res.text)
    live.depth += 1
    live.lp_sum += sum(res.logprobs)
    live.lp_n += len(res.logprobs)
    live.lp_min = min([live.lp_min, *res.logprobs]) if live.lp_n else 0.0
    live.tool_errors += int(bool(step.info.get("tool_error")))
    nid = node_id(live.base["run_id"], live.base["iteration"], live.task.prompt_id, f"{live.path}/{live.depth}")
    done, reward, reason = step.done, step.reward, step.reason
    if not done:
        live.context += list(res.token_ids)
        live.context += chat.observation_ids(step.observation or "", action_closed=chat.ends_closed(res.token_ids))
        if live.depth >= cfg.max_turns:
            done, reward, reason = True, 0.0, TURN_LIMIT
        elif len(live.context) + sampling.max_new_tokens > cfg.max_context_tokens:
            done, reward, reason = True, 0.0, CONTEXT_LIMIT
    row = {
        **live.base, "node_id": nid, "parent_id": live.parent_id, "prompt_id": live.task.prompt_id,
        "trajectory_id": live.trajectory_id, "task": live.task.family, "difficulty": live.task.difficulty,
        "depth": live.depth, "origin": live.origin, "action_text": res.text,
        "observation_text": step.observation, "action_token_ids": list(res.token_ids),
        "action_logprobs": list(res.logprobs), "new_tokens": len(res.token_ids), "is_leaf": done,
        "reward": float(reward) if done else None, "reward_reason": reason if done else None,
        "mean_logprob": live.lp_sum / live.lp_n if live.lp_n else None,
        "min_logprob": live.lp_min if live.lp_n else None, "tool_errors": live.tool_errors,
        "answered": "answer" in step.info, "gen_seconds": seconds, "created_at": utc_now(),
    }
    live.parent_id, live.done = nid, done
    return row


def run_episodes(engine: Engine, chat: Any, lives: list[LiveEpisode], *, sampling: SamplingConfig,
                 cfg: RolloutConfig, seed: int = 0) -> list[dict[str, Any]]:
    """Advance every live episode to its end; returns the node rows of all turns made."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(lives), unit="ep", desc="rollouts", leave=False,
               disable=not cfg.progress or len(lives) < cfg.progress_min_episodes)
    t0, n_tokens = time.perf_counter(), 0
    active = [lv for lv in lives if not lv.done]
    while active:
        cancel.check()  # a stopping pipelined run ends its rollout side here, between turns
        groups: dict[tuple[int, ...], list[LiveEpisode]] = {}
        for lv in active:  # identical contexts -> one request, encoded once
            groups.setdefault(tuple(lv.context), []).append(lv)
        requests = [GenRequest(ctx, n=len(g), seed=_request_seed(seed, g[0].task.prompt_id, g[0].path, g[0].depth))
                    for ctx, g in groups.items()]
        t_gen = time.perf_counter()
        results = engine.generate(requests, sampling)
        elapsed = time.perf_counter() - t_gen
        batch_tokens = max(1, sum(len(r.token_ids) for rs in results for r in rs))
        for group, res_list in zip(groups.values(), results, strict=True):
            for lv, res in zip(group, res_list, strict=True):
                share = elapsed * len(res.token_ids) / batch_tokens  # generate time, split by tokens
                lv.rows.append(_step_row(lv, res, share, sampling, cfg, chat))
                n_tokens += len(res.token_ids)
                bar.update(int(lv.done))
        active = [lv for lv in active if not lv.done]
        bar.set_postfix(tok_s=f"{n_tokens / max(time.perf_counter() - t0, 1e-9):.0f}")
    bar.close()
    return [row for lv in lives for row in lv.rows]


def _root_lives(chat: Any, envs: Mapping[str, Env], tasks: Sequence[Task], counts: Sequence[int],
                base: dict[str, Any]) -> list[LiveEpisode]:
    """``counts[i]`` fresh episodes of ``tasks[i]`` (paths ``r0..r{m-1}``), sharing the prompt ids."""
    run_id, iteration = base["run_id"], base["iteration"]
    lives = []
    for task, m in zip(tasks, counts, strict=True):
        env, prompt = envs[task.family], []
        root_id = node_id(run_id, iteration, task.prompt_id, "root")
        for j in range(int(m)):
            ep = env.reset(task)
            prompt = prompt or chat.prompt_ids(ep.messages())
            path = f"r{j}"
            lives.append(LiveEpisode(task, ep, list(prompt), root_id, node_id(run_id, iteration, task.prompt_id, path),
                                     path, 0, "raw", base))
    return lives


def run_rollouts(engine: Engine, chat: Any, envs: Mapping[str, Env], tasks: Sequence[Task], counts: Sequence[int],
                 *, sampling: SamplingConfig, cfg: RolloutConfig | None = None, seed: int = 0,
                 run_id: str = "run", iteration: int = 0, strategy: str = "uniform",
                 v_pred: Sequence[float] | None = None, utility: Sequence[float] | None = None) -> pl.DataFrame:
    """Raw rollouts: ``counts[i]`` episodes of ``tasks[i]`` (0 skips it). Returns root rows
    (``root_rows``: ``alloc_children=counts[i]``, question in ``action_text``) and turn rows,
    with subtree rewards filled."""
    cfg = cfg or RolloutConfig()
    if len(counts) != len(tasks):
        raise ValueError(f"{len(tasks)} tasks but {len(counts)} counts")
    keep = [i for i, m in enumerate(counts) if m > 0]

    def pick(col: Sequence[Any] | None) -> list[Any] | None:
        return None if col is None else [col[i] for i in keep]

    chosen, m = [tasks[i] for i in keep], [int(counts[i]) for i in keep]
    roots = root_rows(run_id, iteration, strategy, chosen, counts=m, v_pred=pick(v_pred), utility=pick(utility))
    base = {"run_id": run_id, "strategy": strategy, "iteration": iteration}
    lives = _root_lives(chat, envs, chosen, m, base)
    rows = run_episodes(engine, chat, lives, sampling=sampling, cfg=cfg, seed=seed)
    return finalize_tree(pl.concat([roots, nodes_frame(rows)]))


def evaluate_rewards(engine: Engine, chat: Any, envs: Mapping[str, Env], tasks: Sequence[Task], samples: int,
                     *, sampling: SamplingConfig, cfg: RolloutConfig, seed: int = 0) -> np.ndarray:
    """Rewards of ``samples`` episodes of every task, shape ``(len(tasks), samples)``: row ``i`` is
    ``tasks[i]`` (so per-task and per-(family, difficulty) counts follow from it).

    The same episodes ``run_rollouts`` would play with ``counts = [samples] * len(tasks)`` (same
    loop, limits, sampling and seeds); only each episode's final reward is kept (0 for the loop's
    own turn / context limits). For an accuracy that moves only with the policy, give every
    checkpoint the same ``sampling.seed`` and ``seed``.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    base = {"run_id": "eval", "strategy": "eval", "iteration": 0}
    lives = _root_lives(chat, envs, tasks, [samples] * len(tasks), base)
    run_episodes(engine, chat, lives, sampling=sampling, cfg=cfg, seed=seed)
    return np.array([lv.rows[-1]["reward"] for lv in lives], dtype=float).reshape(len(tasks), samples)


def _prefix_live(nodes_by_id: dict[str, dict[str, Any]], parent: dict[str, str | None], prefix: str, k: int,
                 rnd: int, task: Task, env: Env, chat: Any) -> LiveEpisode:
    """Continuation ``k`` of prefix node ``prefix``: env replayed, context rebuilt from the path."""
    path = path_to_root(prefix, parent)
    turns = [nodes_by_id[n] for n in path[1:]]
    ep, results = replay(env, task, [t["action_text"] for t in turns])
    if any(r.done for r in results):
        raise ValueError(f"prefix {prefix} is at or past the end of its episode; only open prefixes extend")
    context = chat.prompt_ids(env.reset(task).messages())
    lp: list[float] = []
    for t in turns:
        ids = list(t["action_token_ids"])
        context += ids + chat.observation_ids(t["observation_text"] or "", action_closed=chat.ends_closed(ids))
        lp += list(t["action_logprobs"])
    p = nodes_by_id[prefix]
    base = {"run_id": p["run_id"], "strategy": p["strategy"], "iteration": p["iteration"]}
    tag = f"{prefix}/x{rnd}.{k}"
    # from the root: one more fresh episode of the prompt, a raw rollout of its group (adaptive groups)
    origin = "raw" if int(p["depth"]) == 0 else "extension"
    return LiveEpisode(task, ep, context, prefix, node_id(base["run_id"], base["iteration"], task.prompt_id, tag),
                       tag, int(p["depth"]), origin, base, lp_sum=sum(lp), lp_n=len(lp),
                       lp_min=min(lp) if lp else 0.0, tool_errors=int(p["tool_errors"] or 0))


def extend_prefixes(engine: Engine, chat: Any, envs: Mapping[str, Env], tasks_by_prompt: Mapping[str, Task],
                    nodes: pl.DataFrame, counts: Mapping[str, int], *, sampling: SamplingConfig,
                    cfg: RolloutConfig | None = None, seed: int = 0, round: int = 0) -> pl.DataFrame:
    """``counts[node_id]`` new continuations from each prefix node of ``nodes``.

    Returns only the new rows (``origin='extension'``, the first turn's parent = the prefix). A
    root (depth 0) is extended too: its continuations are fresh episodes of the prompt that join
    its group (``origin='raw'``; ``allocation.trace.grow_first``).
    Concatenate with ``nodes`` and call ``finalize_tree`` for subtree rewards. ``round``
    distinguishes repeated extension rounds of one iteration (it enters the node ids).
    """
    cfg = cfg or RolloutConfig()
    by_id = {r["node_id"]: r for r in nodes.iter_rows(named=True)}
    parent = {k: v["parent_id"] for k, v in by_id.items()}
    lives = []
    for prefix, k_count in counts.items():
        if prefix not in by_id:
            raise KeyError(f"prefix node {prefix} is not in the node table")
        p = by_id[prefix]
        if p["is_leaf"]:
            raise ValueError(f"node {prefix} is a leaf; extend open prefix nodes or roots")
        task = tasks_by_prompt[p["prompt_id"]]
        for k in range(int(k_count)):
            lives.append(_prefix_live(by_id, parent, prefix, k, round, task, envs[task.family], chat))
    return nodes_frame(run_episodes(engine, chat, lives, sampling=sampling, cfg=cfg, seed=seed))
