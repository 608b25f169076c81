"""One TRACE iteration, stages 1-5, as functions over files (no Prefect, no MLflow here).

Each stage reads the references the previous stages returned, does one thing, writes its
output atomically and returns a small dict: Prefect caches and replays those dicts after a
crash. Stage outputs that are not yet final live under ``runs/<id>/staging/``; the verified
node table of an iteration is the one shard behind the ``nodes`` view (``stages_learn``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from trace_core.config import TrainConfig
from trace_core.rollout import RolloutConfig, extend_prefixes, run_rollouts
from trace_core.runtime import RunRef, candidate_pool, iteration_seed, load_policy_for
from trace_core.shards import read_shard, write_parquet_atomic
from trace_core.strategies import get_strategy
from trace_core.tree import node_id, nodes_frame


def _rollout_cfg(cfg: TrainConfig) -> RolloutConfig:
    return RolloutConfig(max_turns=cfg.env.max_turns,
                         max_context_tokens=min(cfg.model.max_position_embeddings - cfg.sampling.max_new_tokens,
                                                cfg.env.max_tokens_per_episode + 1024))


def _sampling(cfg: TrainConfig, iteration: int, stage: str):
    return cfg.sampling.model_copy(update={"seed": iteration_seed(cfg, iteration, stage) % (2**31)})


def history_nodes(ref: RunRef, before: int) -> pl.DataFrame:
    """Every verified node of this run from iterations ``< before`` (what the predictor learns from)."""
    from trace_core.shards import shard_path

    frames = [read_shard(p) for i in range(before)
              if (p := shard_path(ref.home, "nodes", ref.run_id, "final", i)).is_file()]
    return pl.concat(frames, how="vertical_relaxed") if frames else nodes_frame([])


def refresh_predictor(ref: RunRef, cfg: TrainConfig, iteration: int) -> dict:
    """Stage 1: fit the predictor on all labelled nodes so far; save it for stages 2 and 4."""
    from trace_core.predictor import make_predictor

    t0 = time.perf_counter()
    torch.manual_seed(iteration_seed(cfg, iteration, "predictor") % (2**31))
    prev = ref.predictor(iteration - 1) if iteration > 0 else None
    # warm start from the previous iteration's fit (incremental refresh, bounded time)
    predictor = _load_predictor(str(prev)) if prev is not None and prev.is_file() else make_predictor(cfg.predictor)
    report = predictor.fit(history_nodes(ref, iteration))
    path = ref.predictor(iteration)
    tmp = path.with_suffix(".tmp")
    torch.save(predictor, tmp)
    tmp.replace(path)
    return {"predictor": str(path), "fit": report.as_dict(), "seconds": time.perf_counter() - t0}


def _load_predictor(path: str):
    return torch.load(path, weights_only=False)


def _clip(v: np.ndarray, cfg: TrainConfig) -> np.ndarray:
    eps = cfg.allocation.min_prob
    return np.clip(np.asarray(v, dtype=float), eps, 1.0 - eps)


def root_frame(cfg: TrainConfig, ref: RunRef, iteration: int, tasks) -> pl.DataFrame:
    """The candidate prompts as root rows (depth 0, question in ``action_text``)."""
    return nodes_frame([{
        "run_id": ref.run_id, "strategy": cfg.allocation.strategy, "iteration": iteration,
        "node_id": node_id(ref.run_id, iteration, t.prompt_id, "root"), "prompt_id": t.prompt_id,
        "task": t.family, "difficulty": t.difficulty, "depth": 0, "origin": "root", "action_text": t.question,
        "is_leaf": False, "new_tokens": 0, "tool_errors": 0, "answered": False,
    } for t in tasks])


def allocate_roots(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: dict) -> dict:
    """Stage 2: score the candidate pool and choose m_i per prompt (0 skips it)."""
    from trace_core.utility import root_utility

    t0 = time.perf_counter()
    tasks = candidate_pool(cfg, iteration)
    roots = root_frame(cfg, ref, iteration, tasks)
    v = _clip(_load_predictor(predictor["predictor"]).predict(roots), cfg)
    rng = np.random.default_rng(iteration_seed(cfg, iteration, "roots"))
    m = np.asarray(get_strategy(cfg.allocation.strategy).allocate_roots(v, cfg.allocation, rng), dtype=np.int64)
    prompts = pl.DataFrame({
        "run_id": ref.run_id, "strategy": cfg.allocation.strategy, "iteration": iteration,
        "prompt_id": [t.prompt_id for t in tasks], "task": [t.family for t in tasks],
        "difficulty": [t.difficulty for t in tasks], "v_pred": v, "m_alloc": m,
        "utility": root_utility(v, m),
    })
    path = write_parquet_atomic(prompts, ref.staging(iteration, "prompts"))
    return {"prompts": str(path), "candidates": len(tasks), "active": int((m > 0).sum()),
            "root_budget_used": int(m.sum()), "expected_contrastive": float(root_utility(v, m).sum()),
            "seconds": time.perf_counter() - t0}


def generate_raw(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, roots: dict) -> dict:
    """Stage 3: m_i raw rollouts of every chosen prompt, turn by turn, every node recorded."""
    t0 = time.perf_counter()
    prompts = read_shard(roots["prompts"])
    by_id = {t.prompt_id: t for t in candidate_pool(cfg, iteration)}
    chosen = prompts.filter(pl.col("m_alloc") > 0)
    pol = load_policy_for(cfg, checkpoint)
    nodes = run_rollouts(
        pol.engine, pol.chat, pol.envs, [by_id[p] for p in chosen["prompt_id"]], chosen["m_alloc"].to_list(),
        sampling=_sampling(cfg, iteration, "raw"), cfg=_rollout_cfg(cfg), seed=iteration_seed(cfg, iteration, "raw"),
        run_id=ref.run_id, iteration=iteration, strategy=cfg.allocation.strategy,
        v_pred=chosen["v_pred"].to_list(), utility=chosen["utility"].to_list())
    path = write_parquet_atomic(nodes, ref.staging(iteration, "raw"))
    secs = time.perf_counter() - t0
    tokens = int(nodes["new_tokens"].sum() or 0)
    return {"raw": str(path), "trajectories": int(nodes["is_leaf"].sum()), "tokens": tokens,
            "tokens_per_s": tokens / max(secs, 1e-9), "seconds": secs}


def prefix_candidates(nodes: pl.DataFrame) -> pl.DataFrame:
    """Open prefix nodes of the raw rollouts (depth >= 1, not a leaf) with the 0/1 reward ``r``
    of the raw trajectory they lie on."""
    leaves = nodes.filter(pl.col("is_leaf")).select("trajectory_id", pl.col("reward").alias("r"))
    return (nodes.filter((pl.col("depth") >= 1) & ~pl.col("is_leaf") & (pl.col("origin") == "raw"))
            .join(leaves, on="trajectory_id", how="left")
            .with_columns(pl.col("r").fill_null(0.0)))


def score_prefixes(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: dict, raw: dict, roots: dict) -> dict:
    """Stage 4: predict V at every open prefix, then choose K continuations per prefix."""
    from trace_core.utility import prefix_utility

    t0 = time.perf_counter()
    nodes = read_shard(raw["raw"])
    pred = _load_predictor(predictor["predictor"])
    cands = prefix_candidates(nodes)
    v_all = _clip(pred.predict(nodes), cfg) if nodes.height else np.zeros(0)
    v_by_id = dict(zip(nodes["node_id"].to_list(), v_all.tolist(), strict=True))
    v = np.array([v_by_id[n] for n in cands["node_id"]], dtype=float)
    r = (cands["r"].to_numpy() > 0.5).astype(float)
    ext_budget = max(cfg.allocation.budget_total - int(raw["trajectories"]), 0)
    remaining = np.maximum(cfg.env.max_turns - cands["depth"].to_numpy(), 1)
    rng = np.random.default_rng(iteration_seed(cfg, iteration, "prefixes"))
    k = np.asarray(get_strategy(cfg.allocation.strategy).allocate_prefixes(
        v, r, cands["depth"].to_numpy(), remaining, ext_budget, cfg.allocation, rng), dtype=np.int64)
    alloc = pl.DataFrame({"node_id": cands["node_id"], "v_pred": v, "r": r, "k": k,
                          "utility": prefix_utility(v, r, k) if len(k) else np.zeros(0)},
                         schema_overrides={"k": pl.Int64})
    path = write_parquet_atomic(alloc, ref.staging(iteration, "prefix_alloc"))
    return {"prefix_alloc": str(path), "prefixes": cands.height, "ext_budget": ext_budget,
            "ext_used": int(k.sum()), "branched": int((k > 0).sum()), "seconds": time.perf_counter() - t0}


def extend(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, raw: dict, scored: dict) -> dict:
    """Stage 5: K continuations from each chosen prefix (env replayed, KV of the prefix shared)."""
    t0 = time.perf_counter()
    nodes = read_shard(raw["raw"])
    alloc = read_shard(scored["prefix_alloc"]).filter(pl.col("k") > 0)
    counts = dict(zip(alloc["node_id"].to_list(), alloc["k"].to_list(), strict=True))
    by_id = {t.prompt_id: t for t in candidate_pool(cfg, iteration)}
    pol = load_policy_for(cfg, checkpoint)
    new = extend_prefixes(pol.engine, pol.chat, pol.envs, by_id, nodes, counts,
                          sampling=_sampling(cfg, iteration, "extend"), cfg=_rollout_cfg(cfg),
                          seed=iteration_seed(cfg, iteration, "extend")) if counts else nodes_frame([])
    path = write_parquet_atomic(new, ref.staging(iteration, "extensions"))
    secs = time.perf_counter() - t0
    tokens = int(new["new_tokens"].sum() or 0) if new.height else 0
    return {"extensions": str(path), "trajectories": int(new["is_leaf"].sum() or 0) if new.height else 0,
            "tokens": tokens, "tokens_per_s": tokens / max(secs, 1e-9), "seconds": secs}


def stage_paths(*refs: dict) -> list[Path]:
    return [Path(v) for r in refs for v in r.values() if isinstance(v, str) and v.endswith(".parquet")]
