"""One TRACE iteration: the seven stages in the order the method runs them.

    refresh_predictor      (1) fit the success predictor on every labelled node so far
    allocate_roots         (2) score the candidate pool, choose m_i rollouts per prompt
    generate_raw_rollouts  (3) m_i multi-turn rollouts per chosen prompt, every node recorded
    score_prefixes         (4) predict V at every open prefix, choose K_ijt continuations
    extend_prefixes        (5) K continuations from each chosen prefix
    verify_rewards         (6) re-verify rewards; subtree means, advantages, metrics; final shards
    update_policy          (7) clipped-surrogate update on the trees, next checkpoint
    evaluate, record_iteration   held-out accuracy; the iteration's summary row

Each stage is a function over files (no Prefect, no MLflow): it reads the references earlier
stages returned, does one thing, writes its output atomically and returns a frozen record
(``trace_core.results``) that Prefect can cache and replay after a crash. Stage outputs that are
not final live under ``runs/<id>/staging/``; the verified node table is the shard behind the
``nodes`` view.
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import polars as pl
import torch

from trace_core.advantage import compute_advantages
from trace_core.allocation import get_strategy
from trace_core.config import TrainConfig
from trace_core.metrics import trajectory_metrics
from trace_core.nodes import nodes_frame, root_rows, with_prefix_decisions
from trace_core.policy.live import load_policy_for
from trace_core.prompts import candidate_pool, heldout_pool, tasks_by_id
from trace_core.records import (
    confirmed_confident_share,
    iteration_row,
    prediction_rows,
    prompt_rows,
    prospective_metrics,
    reverify,
)
from trace_core.results import (
    Evaluation,
    Extensions,
    Generation,
    IterationResults,
    PolicyUpdate,
    PredictorFit,
    PrefixAllocation,
    RootAllocation,
    Verified,
)
from trace_core.rollout import RolloutConfig
from trace_core.rollouts import rollouts_for
from trace_core.run import RunRef, bounded_seed, initial_checkpoint, iteration_seed
from trace_core.store.layout import shard_path, write_parquet_atomic
from trace_core.store.shards import ShardWriter, read_shard
from trace_core.utility import prefix_utility, root_utility


# ----------------------------------------------------------------------------- shared settings
@lru_cache(maxsize=4)
def _envs(env_json: str, data_json: str) -> dict:
    from trace_core.datasets import data_envs
    from trace_core.datasets_config import DataConfig
    from trace_core.envs import make_envs
    from trace_core.envs.config import EnvConfig

    env, data = EnvConfig.model_validate_json(env_json), DataConfig.model_validate_json(data_json)
    return data_envs(env, data) if data.enabled else make_envs(env)


def environments(cfg: TrainConfig) -> dict:
    """One environment per family (built once per process: the QA search index is not free);
    with data files, one per family they hold, QA searching their corpus."""
    return _envs(cfg.env.model_dump_json(), cfg.data.model_dump_json())


def rollout_config(cfg: TrainConfig) -> RolloutConfig:
    return RolloutConfig(max_turns=cfg.env.max_turns,
                         max_context_tokens=min(cfg.model.max_position_embeddings - cfg.sampling.max_new_tokens,
                                                cfg.env.max_tokens_per_episode + 1024))


def _sampling(cfg: TrainConfig, iteration: int, stage: str):
    return cfg.sampling.model_copy(update={"seed": bounded_seed(iteration_seed(cfg, iteration, stage))})


def _clip(v: np.ndarray, cfg: TrainConfig) -> np.ndarray:
    eps = cfg.allocation.min_prob
    return np.clip(np.asarray(v, dtype=float), eps, 1.0 - eps)


def _load_predictor(path: str):
    from trace_core.predictor import load_predictor

    return load_predictor(path)


def history_nodes(ref: RunRef, before: int) -> pl.DataFrame:
    """Every verified node of this run from iterations ``< before`` (what the predictor learns from)."""
    frames = [read_shard(p) for i in range(before)
              if (p := shard_path(ref.home, "nodes", ref.run_id, "final", i)).is_file()]
    return pl.concat(frames, how="vertical_relaxed") if frames else nodes_frame([])


def prefix_candidates(nodes: pl.DataFrame) -> pl.DataFrame:
    """Open prefix nodes of the raw rollouts (depth >= 1, not a leaf) with the 0/1 reward ``r``
    of the raw trajectory they lie on."""
    leaves = nodes.filter(pl.col("is_leaf")).select("trajectory_id", pl.col("reward").alias("r"))
    return (nodes.filter((pl.col("depth") >= 1) & ~pl.col("is_leaf") & (pl.col("origin") == "raw"))
            .join(leaves, on="trajectory_id", how="left")
            .with_columns(pl.col("r").fill_null(0.0)))


# ----------------------------------------------------------------------------- (1) - (7)
def _cell_prior(prior: Evaluation | None) -> pl.DataFrame | None:
    """The held-out evaluation's per-cell outcomes as the predictor's iteration-0 prior data."""
    if prior is None or not prior.cells:
        return None
    return pl.DataFrame(prior.cells, schema=["task", "difficulty", "n_success", "n_total"], orient="row")


def refresh_predictor(ref: RunRef, cfg: TrainConfig, iteration: int, prior: Evaluation | None = None) -> PredictorFit:
    """(1) Fit the predictor on all labelled nodes so far, warm-started from the previous fit.
    ``prior``: the held-out evaluation before training, whose per-(family, difficulty) outcomes
    make iteration 0 not blind (the run has measured them anyway, at no extra rollout cost)."""
    from trace_core.predictor import make_predictor

    t0 = time.perf_counter()
    torch.manual_seed(bounded_seed(iteration_seed(cfg, iteration, "predictor")))
    prev = ref.predictor(iteration - 1) if iteration > 0 else None
    predictor = _load_predictor(str(prev)) if prev is not None and prev.is_file() else make_predictor(cfg.predictor)
    report = predictor.fit(history_nodes(ref, iteration), cell_prior=_cell_prior(prior))
    path = predictor.save(ref.predictor(iteration))
    return PredictorFit(path=str(path), fit=report.as_dict(), seconds=time.perf_counter() - t0)


def continuation_reserve(ref: RunRef, iteration: int, slack: float) -> int | None:
    """What the previous iteration bought in continuations, times ``slack`` (``allocation.reserve_slack``;
    None at iteration 0): the first root wave leaves this much of the budget for the prefix stage to price."""
    if iteration == 0:
        return None
    path = shard_path(ref.home, "nodes", ref.run_id, "final", iteration - 1)
    if not path.is_file():
        return None
    prev = read_shard(path)
    bought = prev.filter(pl.col("is_leaf") & (pl.col("origin") == "extension")).height
    return int(np.ceil(slack * bought))


def allocate_roots(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: PredictorFit) -> RootAllocation:
    """(2) Score the candidate pool and choose m_i per prompt (0 skips it)."""
    t0 = time.perf_counter()
    tasks = candidate_pool(cfg, iteration)
    v = _clip(_load_predictor(predictor.path).predict(root_rows(ref.run_id, iteration, cfg.allocation.strategy, tasks)), cfg)
    rng = np.random.default_rng(iteration_seed(cfg, iteration, "roots"))
    strategy = get_strategy(cfg.allocation.strategy)
    budget = strategy.root_budget(cfg.allocation, continuation_reserve(ref, iteration, cfg.allocation.reserve_slack))
    m = np.asarray(strategy.allocate_roots(v, cfg.allocation, rng, budget=budget), dtype=np.int64)
    utility = root_utility(v, m)
    prompts = pl.DataFrame({
        "run_id": ref.run_id, "strategy": cfg.allocation.strategy, "iteration": iteration,
        "prompt_id": [t.prompt_id for t in tasks], "task": [t.family for t in tasks],
        "difficulty": [t.difficulty for t in tasks], "v_pred": v, "m_alloc": m, "utility": utility,
    })
    path = write_parquet_atomic(prompts, ref.staging(iteration, "prompts"))
    return RootAllocation(prompts=str(path), candidates=len(tasks), active=int((m > 0).sum()),
                          root_budget_used=int(m.sum()), expected_contrastive=float(utility.sum()),
                          expected_effective=float((m * utility).sum()), root_budget=budget,
                          threshold=float(strategy.root_threshold(v, m, cfg.allocation)),
                          seconds=time.perf_counter() - t0)


def _generation(nodes: pl.DataFrame, path: Path, t0: float) -> Generation:
    secs = time.perf_counter() - t0
    tokens = int(nodes["new_tokens"].sum() or 0) if nodes.height else 0
    return Generation(path=str(path), trajectories=int(nodes["is_leaf"].sum() or 0) if nodes.height else 0,
                      tokens=tokens, tokens_per_s=tokens / max(secs, 1e-9), seconds=secs)


def _raw_rollouts(cfg: TrainConfig, ref: RunRef, iteration: int, checkpoint: str, prompts: pl.DataFrame,
                  stage: str) -> pl.DataFrame:
    chosen = prompts.filter(pl.col("m_alloc") > 0)
    by_id = tasks_by_id(cfg, iteration)  # on the rollout pool (run.rollout_workers) or here
    return rollouts_for(cfg).raw(
        checkpoint, tasks=[by_id[p] for p in chosen["prompt_id"]],
        counts=chosen["m_alloc"].to_list(), sampling=_sampling(cfg, iteration, stage), cfg=rollout_config(cfg),
        seed=iteration_seed(cfg, iteration, stage), run_id=ref.run_id, iteration=iteration,
        strategy=cfg.allocation.strategy, v_pred=chosen["v_pred"].to_list(), utility=chosen["utility"].to_list())


def generate_raw_rollouts(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str,
                          roots: RootAllocation) -> Generation:
    """(3) m_i raw rollouts of every chosen prompt, turn by turn, every node recorded."""
    t0 = time.perf_counter()
    nodes = _raw_rollouts(cfg, ref, iteration, checkpoint, read_shard(roots.prompts), "raw")
    return _generation(nodes, write_parquet_atomic(nodes, ref.staging(iteration, "raw")), t0)


def _prefix_values(pred, nodes: pl.DataFrame, cands: pl.DataFrame, cfg: TrainConfig):
    """(success V per prefix, flip probability, r, V for the allocator). What decides a
    continuation's value is P(its reward differs from r), predicted directly (conditioned on r,
    depth and the prefix): V = r (1 - flip) + (1 - r) flip makes V_pref = 1 - (1 - flip)^K."""
    v_all = _clip(pred.predict(nodes), cfg) if nodes.height else np.zeros(0)
    v_by_id = dict(zip(nodes["node_id"].to_list(), v_all.tolist(), strict=True))
    v_node = np.array([v_by_id[n] for n in cands["node_id"]], dtype=float)
    r = (cands["r"].to_numpy() > 0.5).astype(float)
    flip = _clip(pred.predict_flip(cands, nodes=nodes), cfg) if cands.height else np.zeros(0)
    return v_node, flip, r, np.where(r > 0.5, 1.0 - flip, flip)


def score_prefixes(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: PredictorFit, roots: RootAllocation,
                   raw: Generation) -> PrefixAllocation:
    """(4) Predict V at every open prefix and choose K continuations per prefix; with one price,
    continuations must beat the roots' price, and what they leave is spent where it is worth most
    (more continuations, or a second root wave that stage 5 generates)."""
    t0 = time.perf_counter()
    nodes = read_shard(raw.path)
    cands = prefix_candidates(nodes)
    v_node, flip, r, v = _prefix_values(_load_predictor(predictor.path), nodes, cands, cfg)
    ext_budget = max(cfg.allocation.budget_total - raw.trajectories, 0)
    remaining = np.maximum(cfg.env.max_turns - cands["depth"].to_numpy(), 1)
    rng = np.random.default_rng(iteration_seed(cfg, iteration, "prefixes"))
    strategy = get_strategy(cfg.allocation.strategy)
    k = np.asarray(strategy.allocate_prefixes(v, r, cands["depth"].to_numpy(), remaining, ext_budget, cfg.allocation,
                                              rng, min_gain=roots.threshold), dtype=np.int64)
    prompts = read_shard(roots.prompts)
    m2, extra = strategy.spend_leftover(prompts["v_pred"].to_numpy(), prompts["m_alloc"].to_numpy() > 0, v, r, k,
                                        ext_budget - int(k.sum()), cfg.allocation)
    k = k + np.asarray(extra, dtype=np.int64)
    alloc = pl.DataFrame({"node_id": cands["node_id"], "v_pred": v_node, "flip": flip, "r": r, "k": k,
                          "utility": prefix_utility(v, r, k) if len(k) else np.zeros(0)},
                         schema_overrides={"k": pl.Int64})
    wave = None
    if int(np.sum(m2)) > 0:
        m2 = np.asarray(m2, dtype=np.int64)
        wave = str(write_parquet_atomic(prompts.with_columns(
            pl.Series("m_alloc", m2), pl.Series("utility", root_utility(prompts["v_pred"].to_numpy(), m2))),
            ref.staging(iteration, "prompts_wave2")))
    path = write_parquet_atomic(alloc, ref.staging(iteration, "prefix_alloc"))
    return PrefixAllocation(path=str(path), prefixes=cands.height, ext_budget=ext_budget, ext_used=int(k.sum()),
                            branched=int((k > 0).sum()), wave_prompts=wave, wave_rollouts=int(np.sum(m2)),
                            seconds=time.perf_counter() - t0)


def extend_prefixes(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, raw: Generation,
                    prefixes: PrefixAllocation) -> Extensions:
    """(5) K continuations from each chosen prefix (environment replayed, prefix KV shared), and
    the second root wave stage 4 bought with what the continuations left (one price only)."""
    t0 = time.perf_counter()
    alloc = read_shard(prefixes.path).filter(pl.col("k") > 0)
    counts = dict(zip(alloc["node_id"].to_list(), alloc["k"].to_list(), strict=True))
    new = nodes_frame([])
    if counts:
        new = rollouts_for(cfg).extend(checkpoint, tasks_by_prompt=tasks_by_id(cfg, iteration),
                                       nodes=read_shard(raw.path), counts=counts,
                                       sampling=_sampling(cfg, iteration, "extend"), cfg=rollout_config(cfg),
                                       seed=iteration_seed(cfg, iteration, "extend"))
    cont = _generation(new, write_parquet_atomic(new, ref.staging(iteration, "extensions")), t0)
    if not prefixes.wave_prompts:
        return Extensions(**{**cont.model_dump(), "seconds": time.perf_counter() - t0})
    wave = _raw_rollouts(cfg, ref, iteration, checkpoint, read_shard(prefixes.wave_prompts), "raw-wave2")
    return Extensions(**{**cont.model_dump(), "seconds": time.perf_counter() - t0},
                      wave_path=str(write_parquet_atomic(wave, ref.staging(iteration, "raw_wave2"))),
                      wave_prompts=prefixes.wave_prompts, wave_trajectories=int(wave["is_leaf"].sum() or 0),
                      wave_tokens=int(wave["new_tokens"].sum() or 0))


def verify_rewards(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: PredictorFit, roots: RootAllocation,
                   raw: Generation, prefixes: PrefixAllocation, extensions: Extensions) -> Verified:
    """(6) Re-verify rewards, fill subtree rewards, prefix decisions and advantages; write the
    iteration's node, prompt and prediction shards (the rows behind the views)."""
    t0 = time.perf_counter()
    parts = [raw.path, extensions.path] + ([extensions.wave_path] if extensions.wave_path else [])
    nodes = pl.concat([read_shard(p) for p in parts], how="vertical_relaxed")
    nodes, mismatched = reverify(nodes, environments(cfg), tasks_by_id(cfg, iteration))
    nodes = with_prefix_decisions(nodes, read_shard(prefixes.path))
    nodes = compute_advantages(nodes, cfg.advantage)
    writer = ShardWriter(ref.home, ref.run_id, strategy=cfg.allocation.strategy)
    writer.write("nodes", nodes, stage="final", iteration=iteration)
    prompts = read_shard(roots.prompts)
    if extensions.wave_prompts:  # the second wave's m (it samples only prompts the first skipped)
        wave = read_shard(extensions.wave_prompts)
        prompts = prompts.with_columns(pl.col("m_alloc") + wave["m_alloc"],
                                       pl.when(wave["m_alloc"] > 0).then(wave["utility"]).otherwise(pl.col("utility")))
    prompts = prompt_rows(prompts, nodes)
    writer.write("prompts", prompts, stage="final", iteration=iteration)
    writer.write("predictions", prediction_rows(nodes), stage="final", iteration=iteration)
    return Verified(nodes=str(writer.path("nodes", stage="final", iteration=iteration)),
                    predictor_metrics=prospective_metrics(nodes, _load_predictor(predictor.path)),
                    confirmed_confident_share=confirmed_confident_share(prompts),
                    reward_mismatches=mismatched, seconds=time.perf_counter() - t0, **trajectory_metrics(nodes))


def update_policy(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, verified: Verified) -> PolicyUpdate:
    """(7) One clipped-surrogate update on the iteration's trees; save the next checkpoint."""
    from trace_core.policy.checkpoint import has_trainer_state, load_checkpoint, save_checkpoint
    from trace_core.policy.update import build_sequences, make_optimizer, reference_policy
    from trace_core.policy.update import update_policy as clipped_update

    t0 = time.perf_counter()
    # a retry starts from the input checkpoint, not from weights a failed attempt partly updated:
    # with trainer state, load_checkpoint below restores them; without (iteration 0), reload here
    pol = load_policy_for(cfg, checkpoint, fresh=not has_trainer_state(checkpoint))
    nodes = read_shard(verified.nodes)
    tasks, envs = tasks_by_id(cfg, iteration), environments(cfg)
    messages = {p: envs[tasks[p].family].reset(tasks[p]).messages() for p in nodes["prompt_id"].unique()}
    skip = get_strategy(cfg.allocation.strategy).drop_zero_variance or (
        cfg.update.skip_zero_advantage and not cfg.update.uses_reference)  # with KL, A = 0 sequences still train
    seqs = build_sequences(nodes, pol.chat, messages, skip_zero_advantage=skip)
    out, seed = ref.checkpoint(iteration), iteration_seed(cfg, iteration, "update")
    reference = initial_checkpoint(cfg) if cfg.update.uses_reference else None  # KL to the warm-start policy
    pol.engine.sleep()  # a colocated vLLM engine frees the GPU for the trainer; a no-op for hf
    if cfg.update.strategy != "single" and seqs:  # torchrun ranks read the inputs from files, rank 0 saves
        from trace_core.policy.distributed import UpdateJob, launch_update

        job = UpdateJob(checkpoint=checkpoint, out=str(out), reference=reference, update=cfg.update, seed=seed,
                        torch_seed=bounded_seed(seed), pad_id=pol.tokenizer.pad_token_id,
                        cursor={"iteration": iteration + 1}, threads=cfg.run.threads)
        stats = launch_update(job, seqs, ref.staging(iteration, "update").with_suffix(".job"))
    else:
        optimizer, scheduler = make_optimizer(pol.model, cfg.update)
        if has_trainer_state(checkpoint):  # continue the optimizer of the last update
            load_checkpoint(checkpoint, pol.model, optimizer=optimizer, scheduler=scheduler, restore_rng=False)
        torch.manual_seed(bounded_seed(seed))
        ref_model = reference_policy(reference, str(next(pol.model.parameters()).device)) if reference else None
        stats = clipped_update(pol.model, optimizer, scheduler, seqs, cfg.update, pad_id=pol.tokenizer.pad_token_id,
                               seed=seed, ref_model=ref_model)
        save_checkpoint(out, pol.model, optimizer=optimizer, scheduler=scheduler, tokenizer=pol.tokenizer,
                        cursor={"iteration": iteration + 1})
    pol.engine.wake()  # the next stage loads the new weights into it (policy.live.load_policy_for)
    return PolicyUpdate(checkpoint=str(out), stats={k: float(v) for k, v in stats.items()},
                        seconds=time.perf_counter() - t0)


# ----------------------------------------------------------------------------- evaluate, record
def evaluate(cfg: TrainConfig, checkpoint: str) -> Evaluation:
    """Held-out accuracy (mean sampled reward) per family and overall."""
    t0 = time.perf_counter()
    tasks = heldout_pool(cfg)
    if not tasks or cfg.run.eval_tasks == 0:
        return Evaluation()
    seed = iteration_seed(cfg, 0, "eval")  # the same episodes' randomness for every checkpoint
    rewards = rollouts_for(cfg).evaluate(checkpoint, tasks=tasks, samples=cfg.run.eval_samples,
                                         sampling=cfg.sampling.model_copy(update={"seed": bounded_seed(seed)}),
                                         cfg=rollout_config(cfg), seed=seed)
    return _evaluation(tasks, rewards, time.perf_counter() - t0)


def _evaluation(tasks, rewards: np.ndarray, seconds: float) -> Evaluation:
    fam = np.array([t.family for t in tasks])
    cells = pl.DataFrame({"task": fam, "difficulty": [int(t.difficulty) for t in tasks],
                          "s": (rewards > 0.5).sum(axis=1), "n": np.full(len(tasks), rewards.shape[1])})
    cells = cells.group_by("task", "difficulty").agg(pl.col("s").sum(), pl.col("n").sum()).sort("task", "difficulty")
    return Evaluation(accuracy=float(rewards.mean()),
                      by_family={f: float(rewards[fam == f].mean()) for f in sorted(set(fam))},
                      cells=[tuple(r) for r in cells.iter_rows()], seconds=seconds)


def record_iteration(ref: RunRef, cfg: TrainConfig, iteration: int, results: IterationResults,
                     accuracy: Evaluation) -> dict:
    """Write the iteration's summary row (budget, tokens, metrics, accuracy, stage timings)."""
    row = iteration_row(ref.run_id, cfg.allocation.strategy, iteration, cfg.allocation.budget_total, results, accuracy)
    ShardWriter(ref.home, ref.run_id).write("iterations", pl.DataFrame([row]), stage="final", iteration=iteration)
    return row
