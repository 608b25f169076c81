"""SYNTHETIC rollout trees for exercising the predictor (tests, benchmarks) — not a policy.

A latent-logit world, NOT the tiny policy and NOT the oracle simulator of ``trace_core.analysis.simulate``:
each prompt has a skill logit ``a = 1.6 - 0.8*difficulty + family offset + N(0, prompt_sd)`` that
rises by ``improve`` per iteration (the policy learns). A trajectory starts at ``z = a + N(0, 0.5)``
and each turn adds ``N(0, step_sd)``; a tool error (prob ``sigmoid(-z - 1)``) costs 0.6 logits; the
turn's log-probs are noisy readings of ``z``; the last turn answers and the reward is
``Bernoulli(sigmoid(z))``. Question texts carry the family and difficulty (longer expressions,
more hops, more arguments). Per iteration: ``prompts_per_iter`` prompts drawn from a fixed pool,
``m`` raw rollouts each, then ``k`` continuations from a random ``extend_fraction`` of the
non-leaf prefixes. Rows follow ``NODE_SCHEMA`` plus ``true_p`` (an approximate oracle
success probability, for reference ceilings).

``cell_rate_iteration``: a simpler world for learning-speed tests, in which every prompt of a
(family, difficulty) cell succeeds with exactly the cell's given rate.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.nodes import NODE_SCHEMA, node_id

FAMILIES = {"math": 0.3, "qa": 0.0, "fc": -0.3}
_WORDS = "river castle author city founder museum album singer bridge treaty".split()


def _question(rng: np.random.Generator, family: str, diff: int) -> str:
    if family == "math":
        nums = rng.integers(2, 10 ** (1 + diff // 2), size=diff + 2)
        ops = rng.choice(["+", "-", "*"], size=diff + 1)
        expr = str(nums[0]) + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:], strict=True))
        return f"Compute {expr} using the calculator."
    if family == "qa":
        hops = " of the ".join(rng.choice(_WORDS, size=diff + 2))
        return f"Who is the {hops}? Search the corpus."
    args = ", ".join(f"{w}={int(rng.integers(0, 99))}" for w in rng.choice(_WORDS, size=diff + 1))
    return f"Call the booking tool with {args}."


def make_pool(n_prompts: int, seed: int, prompt_sd: float = 0.8) -> list[dict]:
    rng = np.random.default_rng(seed)
    pool = []
    for i in range(n_prompts):
        fam = list(FAMILIES)[i % 3]
        diff = int(rng.integers(0, 5))
        skill = 1.6 - 0.8 * diff + FAMILIES[fam] + rng.normal(0, prompt_sd)
        pool.append({"prompt_id": f"p{i:05d}", "task": fam, "difficulty": diff,
                     "question": _question(rng, fam, diff), "skill": skill})  # fmt: skip
    return pool


def _oracle(z: float, turns_left: int, step_sd: float) -> float:
    # probit-style approximation of E[sigmoid(z + noise)] over the remaining random walk
    var = turns_left * step_sd**2
    return float(1.0 / (1.0 + np.exp(-z / np.sqrt(1.0 + np.pi * var / 8.0))))


def _walk(rng, start: dict, n_turns: int, ctx: dict, step_sd: float) -> list[dict]:
    """Continue a trajectory from ``start`` (its z, depth, running stats) to an answered leaf."""
    rows, z, lp_sum, lp_min, errs = [], start["z"], start["lp_sum"], start["lp_min"], start["errs"]
    parent = start["node_id"]
    traj = node_id(ctx["run"], ctx["it"], parent, rng.integers(1 << 30))
    for depth in range(start["depth"] + 1, n_turns + 1):
        z += rng.normal(0, step_sd)
        last = depth == n_turns
        err = (not last) and rng.random() < 1 / (1 + np.exp(z + 1))
        if err:
            z -= 0.6
        turn_lp = -0.25 - 0.35 / (1 + np.exp(z)) + rng.normal(0, 0.08)
        turn_min = -1.0 - 3.0 / (1 + np.exp(z)) + rng.normal(0, 0.6)
        lp_sum, lp_min = lp_sum + turn_lp, min(lp_min, turn_min)
        errs += int(err)
        nid = node_id(ctx["run"], ctx["it"], traj, depth)
        if last:
            reward = float(rng.random() < 1 / (1 + np.exp(-z)))
            action, obs = f"The answer is <answer>{int(rng.integers(0, 999))}</answer>", None
        else:
            reward, tool = None, ctx["tool"]
            action = (
                f'<tool_call>{{"name": "{tool}", "arguments": {{"q": "{rng.choice(_WORDS)}"}}}}</tool_call>'
            )
            obs = (
                "Error: invalid arguments"
                if err
                else f"result: {rng.choice(_WORDS)} {int(rng.integers(0, 99))}"
            )
        rows.append({
            "node_id": nid, "parent_id": parent, "trajectory_id": traj, "depth": depth,
            "action_text": action, "observation_text": obs, "is_leaf": last, "reward": reward,
            "mean_logprob": lp_sum / depth, "min_logprob": lp_min, "tool_errors": errs, "answered": last,
            "true_p": reward if last else _oracle(z, n_turns - depth, step_sd),
            "_z": z, "_lp_sum": lp_sum, "_lp_min": lp_min,
        })  # fmt: skip
        parent = nid
    return rows


def synthetic_iteration(pool: list[dict], iteration: int, *, seed: int, prompts_per_iter: int = 64,
                        m: int = 4, k: int = 2, extend_fraction: float = 0.3, improve: float = 0.25,
                        step_sd: float = 0.6, run_id: str = "synthetic") -> pl.DataFrame:  # fmt: skip
    """One iteration's trees: NODE_SCHEMA columns (+ ``true_p``) with subtree labels filled."""
    rng = np.random.default_rng([seed, iteration])
    chosen = rng.choice(len(pool), size=min(prompts_per_iter, len(pool)), replace=False)
    rows: list[dict] = []
    for pi in chosen:
        pr = pool[pi]
        ctx = {
            "run": run_id,
            "it": iteration,
            "tool": {"math": "calculator", "qa": "search", "fc": "book"}[pr["task"]],
        }
        root_id = node_id(run_id, iteration, pr["prompt_id"])
        base = pr["skill"] + improve * iteration
        n_turns = 2 + pr["difficulty"] // 2
        root = {"node_id": root_id, "parent_id": None, "depth": 0, "origin": "root", "action_text": pr["question"],
                "is_leaf": False, "true_p": _oracle(base, n_turns + 1, np.sqrt(step_sd**2 + 0.25 / (n_turns + 1)))}  # fmt: skip
        tree = [root]
        for _ in range(m):
            start = {"node_id": root_id, "depth": 0, "z": base + rng.normal(0, 0.5), "lp_sum": 0.0,
                     "lp_min": 0.0, "errs": 0}  # fmt: skip
            tree += [r | {"origin": "raw"} for r in _walk(rng, start, n_turns, ctx, step_sd)]
        prefixes = [r for r in tree if r["depth"] > 0 and not r["is_leaf"]]
        for r in prefixes:
            if rng.random() < extend_fraction:
                start = {"node_id": r["node_id"], "depth": r["depth"], "z": r["_z"], "lp_sum": r["_lp_sum"],
                         "lp_min": r["_lp_min"], "errs": r["tool_errors"]}  # fmt: skip
                for _ in range(k):
                    tree += [x | {"origin": "extension"} for x in _walk(rng, start, n_turns, ctx, step_sd)]
        for r in tree:
            r.update(run_id=run_id, iteration=iteration, prompt_id=pr["prompt_id"], task=pr["task"],
                     difficulty=pr["difficulty"], strategy="synthetic")  # fmt: skip
        rows += _label(tree)
    df = pl.DataFrame([{c: r.get(c) for c in [*NODE_SCHEMA, "true_p"]} for r in rows],
                      schema={**NODE_SCHEMA, "true_p": pl.Float64})  # fmt: skip
    return df


def _label(tree: list[dict]) -> list[dict]:
    """Fill subtree_mean_reward / subtree_count from the leaves (children after parents in ``tree``)."""
    by_id = {r["node_id"]: r for r in tree}
    for r in tree:
        r["_s"], r["_c"] = 0.0, 0
    for r in tree:
        if r["is_leaf"]:
            p = r
            while p is not None:
                p["_s"] += r["reward"]
                p["_c"] += 1
                p = by_id.get(p["parent_id"])
    for r in tree:
        r["subtree_count"] = r["_c"]
        r["subtree_mean_reward"] = r["_s"] / r["_c"] if r["_c"] else None
    return tree


def synthetic_run(n_iterations: int, *, seed: int = 0, n_prompts: int = 400, **kw) -> pl.DataFrame:
    """Iterations 0..n_iterations-1 of synthetic trees over one prompt pool."""
    pool = make_pool(n_prompts, seed)
    return pl.concat([synthetic_iteration(pool, t, seed=seed, **kw) for t in range(n_iterations)])


def cell_rate_iteration(rates: dict[tuple[str, int], float], iteration: int, *, seed: int, n_prompts: int = 64,
                        m: int = 4, turns: int = 2, prompt_offset: int = 0,
                        run_id: str = "cells") -> pl.DataFrame:  # fmt: skip
    """One iteration of trees in which every prompt of cell ``(task, difficulty)`` succeeds with
    exactly ``rates[cell]``: ``n_prompts`` prompts spread evenly over the cells (ids from
    ``prompt_offset``), ``m`` raw rollouts of ``turns`` tool turns each, then an answer. For tests
    of how fast the predictor learns known cell rates; NODE_SCHEMA rows, subtree labels filled."""
    rng = np.random.default_rng([seed, iteration])
    cells = sorted(rates)
    rows: list[dict] = []
    for i in range(n_prompts):
        task, diff = cells[i % len(cells)]
        pid = f"{task}-d{diff}-{prompt_offset + i:05d}"
        root_id = node_id(run_id, iteration, pid)
        tree = [{"node_id": root_id, "parent_id": None, "depth": 0, "origin": "root", "is_leaf": False,
                 "action_text": _question(rng, task, diff)}]  # fmt: skip
        for j in range(m):
            traj, parent = node_id(run_id, iteration, pid, j), root_id
            reward = float(rng.random() < rates[(task, diff)])
            for depth in range(1, turns + 2):
                nid, last = node_id(run_id, iteration, pid, j, depth), depth == turns + 1
                tree.append({"node_id": nid, "parent_id": parent, "trajectory_id": traj, "depth": depth,
                             "origin": "raw", "is_leaf": last, "reward": reward if last else None,
                             "action_text": "<answer>1</answer>" if last else '<tool_call>{"name": "search"}</tool_call>',
                             "observation_text": None if last else "result: ok", "tool_errors": 0,
                             "answered": last})  # fmt: skip
                parent = nid
        for r in tree:
            r.update(run_id=run_id, iteration=iteration, prompt_id=pid, task=task, difficulty=diff,
                     strategy="synthetic")  # fmt: skip
        rows += _label(tree)
    return pl.DataFrame([{c: r.get(c) for c in NODE_SCHEMA} for r in rows], schema=NODE_SCHEMA)
