"""One TRACE iteration: the seven stages in the order the method runs them.

    refresh_predictor      (1) fit the success predictor on every labelled node so far
    allocate_roots         (2) score the candidate pool, choose m_i rollouts per prompt
    generate_raw_rollouts  (3) m_i multi-turn rollouts per chosen prompt, every node recorded
    score_prefixes         (4) predict V at every open prefix, choose K_ijt continuations
    extend_and_refill      (5) K continuations from each chosen prefix, then the second root wave
    verify_rewards         (6) re-verify rewards; subtree means, advantages, metrics; final shards
    update_policy          (7) clipped-surrogate update on the trees, next checkpoint
    evaluate, record_iteration   held-out accuracy; the iteration's summary row

Each stage is a function over files (no Prefect, no MLflow): it reads the references earlier
stages returned, does one thing, writes its output atomically and returns a frozen record
(``trace_core.stages.results``) that Prefect can cache and replay after a crash. Stage outputs that are
not final live under ``runs/<id>/staging/``; the verified node table is the shard behind the
``nodes`` view.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.advantages.estimators import compute_advantages
from trace_core.allocation.growth import first_wave
from trace_core.allocation.planner import (
    RootPlan,
    iteration_budget,
    plan_prefixes,
    plan_roots,
    stratum_labels,
)
from trace_core.config import TrainConfig
from trace_core.home.layout import write_parquet_atomic
from trace_core.home.shards import ShardWriter, read_shard
from trace_core.metrics import trajectory_metrics
from trace_core.nodes import nodes_frame, root_rows, with_prefix_decisions
from trace_core.predictor import load_predictor, make_predictor
from trace_core.runtime import Runtime, rollout_config
from trace_core.stages.growth import ALLOC_SCHEMA, PREFIX, grow_plan, growing, prefix_decisions, with_growth
from trace_core.stages.history import history_nodes as history_nodes  # the record a plan may read
from trace_core.stages.history_shift import history_shift
from trace_core.stages.oracle import oracle_blend, oracle_prefix_values, oracle_root_values
from trace_core.stages.prompt_pools import candidate_pool, heldout_pool, probe_pool, tasks_by_id
from trace_core.stages.records import (
    confirmed_confident_share,
    iteration_row,
    prediction_rows,
    prompt_rows,
    prospective_metrics,
    reverify,
    zero_variance_groups,
)
from trace_core.stages.reference import reference_scores, with_reference_scores
from trace_core.stages.rest import rested
from trace_core.stages.results import (
    Evaluation,
    Extensions,
    Generation,
    IterationResults,
    PredictorFit,
    PrefixAllocation,
    RootAllocation,
    Verified,
)
from trace_core.stages.root_values import planned_v, root_concentration, root_values, stored_concentration
from trace_core.stages.run import RunRef, bounded_seed, iteration_seed, torch_seeded
from trace_core.stages.spending import previous_continuations, spent_tokens
from trace_core.stages.update import update_policy as update_policy  # (7), in its own module
from trace_core.stages.versions import checkpoint_version, outcome_version, rollout_version, stamp_version
from trace_core.utility import prefix_utility


# ----------------------------------------------------------------------------- shared settings
def _sampling(cfg: TrainConfig, iteration: int, stage: str):
    return cfg.sampling.model_copy(update={"seed": bounded_seed(iteration_seed(cfg, iteration, stage))})


def _clip(v: np.ndarray, cfg: TrainConfig) -> np.ndarray:
    eps = cfg.allocation.min_prob
    return np.clip(np.asarray(v, dtype=float), eps, 1.0 - eps)


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
    t0 = time.perf_counter()
    history = history_nodes(ref, iteration, max_version=rollout_version(iteration, cfg.run.max_staleness))
    if cfg.predictor.reference.enabled:
        history = with_reference_scores(history, ref, iteration)
    cells = _cell_prior(prior)
    with torch_seeded(bounded_seed(iteration_seed(cfg, iteration, "predictor"))):  # the fit's draws: its own
        prev = ref.predictor(iteration - 1) if iteration > 0 else None
        predictor = load_predictor(str(prev)) if prev is not None and prev.is_file() else make_predictor(cfg.predictor)
        report = predictor.fit(history, cell_prior=cells)
    path = predictor.save(ref.predictor(iteration))
    seen = outcome_version(history)  # the prior is the warm start's (version 0) held-out outcomes
    seen = seen if seen is not None else (0 if cells is not None else None)
    return PredictorFit(path=str(path), fit=report, outcome_version=seen, seconds=time.perf_counter() - t0)


def _rollout_policy(checkpoint: str | None, runtime: Runtime | None):
    """The policy the rollouts will use (the reference score and the history shift read it)."""
    if checkpoint is None or runtime is None:
        raise ValueError("predictor.reference / history_shift: the scores need the policy; pass checkpoint and runtime")
    return runtime.live.get(checkpoint)


def _reference_scores(cfg: TrainConfig, tasks, checkpoint: str | None, runtime: Runtime | None) -> np.ndarray:
    """Each candidate's reference score under ``checkpoint`` (``stages.reference``)."""
    return reference_scores(_rollout_policy(checkpoint, runtime), tasks, runtime.envs, temperature=cfg.sampling.temperature,
                            max_tokens=cfg.model.max_position_embeddings)


def _allocation(cfg: TrainConfig, roots: RootAllocation):
    """The allocation settings with this iteration's trajectory budget (stage 2 chose it)."""
    return cfg.allocation.model_copy(update={"budget_total": roots.budget}) if roots.budget else cfg.allocation


def allocate_roots(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: PredictorFit,
                   checkpoint: str | None = None, runtime: Runtime | None = None) -> RootAllocation:
    """(2) Score the candidate pool; the planner sets the iteration's trajectory budget and
    chooses m_i per prompt (0 skips it), the reserve and the roots' price. With
    ``predictor.oracle_samples`` the scores are success rates sampled under the policy at
    ``checkpoint`` (the oracle bound, ``stages.oracle``)."""
    t0 = time.perf_counter()
    tasks = candidate_pool(cfg, iteration)
    oracle_tokens = 0
    conc = None
    ref_score = np.full(len(tasks), np.nan)
    if cfg.predictor.oracle_samples and cfg.predictor.oracle_knows == "rates":
        if checkpoint is None or runtime is None:
            raise ValueError("predictor.oracle_samples: the oracle samples under the policy; pass checkpoint and runtime")
        v, oracle_tokens = oracle_root_values(ref, cfg, iteration, checkpoint, tasks, runtime)
        v = _clip(v, cfg)
    else:
        pred = load_predictor(predictor.path)
        rows = root_rows(ref.run_id, iteration, cfg.allocation.strategy, tasks)
        if cfg.predictor.reference.enabled:
            ref_score = _reference_scores(cfg, tasks, checkpoint, runtime)
            rows = rows.with_columns(pl.Series("ref_score", ref_score, dtype=pl.Float64))
        v = _clip(pred.predict(rows), cfg)
        conc = root_concentration(pred, rows)
        if cfg.predictor.oracle_samples:  # oracle_knows zeros / extremes: a part of what the oracle knows
            if checkpoint is None or runtime is None:
                raise ValueError("predictor.oracle_samples: the oracle samples under the policy; pass checkpoint and "
                                 "runtime")
            sampled, oracle_tokens = oracle_root_values(ref, cfg, iteration, checkpoint, tasks, runtime)
            v = _clip(oracle_blend(v, sampled, cfg.predictor.oracle_knows), cfg)
    v_unshifted, shift = v, np.full(len(tasks), np.nan)
    if cfg.predictor.history_shift.enabled and not cfg.predictor.oracle_samples:
        v, shift, _ = history_shift(ref, cfg, iteration, v, tasks, _rollout_policy(checkpoint, runtime), runtime.envs)
        v = _clip(v, cfg)
    if cfg.predictor.zero_variance_rest or cfg.predictor.cooldown:
        v = _clip(rested(ref, cfg, iteration, v, [t.prompt_id for t in tasks]), cfg)
    rng = np.random.default_rng(iteration_seed(cfg, iteration, "roots"))
    budget = cfg.allocation.budget_total
    if cfg.allocation.budget_tokens is not None:
        budget = iteration_budget(cfg.allocation, iteration, *spent_tokens(ref, iteration))
    alloc = cfg.allocation.model_copy(update={"budget_total": budget})
    v_plan = planned_v(cfg, iteration, v, conc)  # the mean, or a posterior draw (root_thompson)
    plan = plan_roots(v_plan, first_wave(alloc), rng, previous_continuations=previous_continuations(ref, iteration),
                      strata=stratum_labels(cfg.allocation.stratify, [t.family for t in tasks], [t.difficulty for t in tasks]),
                      concentration=conc)
    utility = root_values(cfg, v_plan, conc, plan.m)
    prompts = pl.DataFrame({
        "run_id": ref.run_id, "strategy": cfg.allocation.strategy, "iteration": iteration,
        "prompt_id": [t.prompt_id for t in tasks], "task": [t.family for t in tasks],
        "difficulty": [t.difficulty for t in tasks], "v_pred": v, "m_alloc": plan.m, "utility": utility,
        "v_concentration": conc if conc is not None else np.full(len(tasks), np.nan),
        "ref_score": pl.Series(ref_score, dtype=pl.Float64).fill_nan(None),
        "is_shift": pl.Series(shift, dtype=pl.Float64).fill_nan(None), "v_unshifted": v_unshifted,
        "policy_version": checkpoint_version(ref, checkpoint) if checkpoint else rollout_version(
            iteration, cfg.run.max_staleness), "outcome_version": predictor.outcome_version,
    }, schema_overrides={"policy_version": pl.Int32, "outcome_version": pl.Int32})
    path = write_parquet_atomic(prompts, ref.staging(iteration, "prompts"))
    return RootAllocation(prompts=str(path), candidates=len(tasks), active=int((plan.m > 0).sum()),
                          root_budget_used=plan.used, expected_contrastive=float(utility.sum()),
                          expected_effective=float((plan.m * utility).sum()), root_budget=plan.budget,
                          threshold=plan.price, budget=budget, oracle_tokens=oracle_tokens,
                          seconds=time.perf_counter() - t0)


def _generation(nodes: pl.DataFrame, path: Path, t0: float) -> Generation:
    secs = time.perf_counter() - t0
    tokens = int(nodes["new_tokens"].sum() or 0) if nodes.height else 0
    return Generation(path=str(path), trajectories=int(nodes["is_leaf"].sum() or 0) if nodes.height else 0,
                      tokens=tokens, tokens_per_s=tokens / max(secs, 1e-9), seconds=secs)


def _raw_rollouts(cfg: TrainConfig, ref: RunRef, iteration: int, checkpoint: str, prompts: pl.DataFrame,
                  stage: str, runtime: Runtime) -> pl.DataFrame:
    chosen = prompts.filter(pl.col("m_alloc") > 0)
    by_id = tasks_by_id(cfg, iteration)  # on the rollout pool (run.rollout_workers) or here
    return runtime.rollouts.raw(
        checkpoint, tasks=[by_id[p] for p in chosen["prompt_id"]],
        counts=chosen["m_alloc"].to_list(), sampling=_sampling(cfg, iteration, stage), cfg=rollout_config(cfg),
        seed=iteration_seed(cfg, iteration, stage), run_id=ref.run_id, iteration=iteration,
        strategy=cfg.allocation.strategy, v_pred=chosen["v_pred"].to_list(), utility=chosen["utility"].to_list())


def generate_raw_rollouts(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str,
                          roots: RootAllocation, runtime: Runtime) -> Generation:
    """(3) m_i raw rollouts of every chosen prompt, turn by turn, every node recorded."""
    t0 = time.perf_counter()
    nodes = _raw_rollouts(cfg, ref, iteration, checkpoint, read_shard(roots.prompts), "raw", runtime)
    nodes = stamp_version(nodes, checkpoint_version(ref, checkpoint))
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


def _root_plan(cfg: TrainConfig, roots: RootAllocation, prompts: pl.DataFrame) -> RootPlan:
    """The first wave's plan as stage 2 recorded it (``RootAllocation`` + its prompts shard)."""
    return RootPlan(m=prompts["m_alloc"].to_numpy().astype(np.int64), budget=roots.root_budget,
                    reserve=_allocation(cfg, roots).budget_total - roots.root_budget, price=roots.threshold)


def score_prefixes(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: PredictorFit, roots: RootAllocation,
                   raw: Generation, checkpoint: str | None = None, runtime: Runtime | None = None) -> PrefixAllocation:
    """(4) Predict V at every open prefix; the planner chooses K continuations per prefix (with one
    price, only where they beat the roots' price) and spends what is left where it is worth most:
    more continuations, or a second root wave (the refill stage 5 generates)."""
    t0 = time.perf_counter()
    nodes = read_shard(raw.path)
    cands = prefix_candidates(nodes)
    v_node, flip, r, v = _prefix_values(load_predictor(predictor.path), nodes, cands, cfg)
    oracle_tokens = 0
    if cfg.predictor.oracle_samples and cfg.predictor.oracle_stages == "both":  # sampled, not predicted (stages.oracle)
        if checkpoint is None or runtime is None:
            raise ValueError("predictor.oracle_samples: the oracle samples under the policy; pass checkpoint and runtime")
        v_node, flip, oracle_tokens = oracle_prefix_values(cfg, iteration, checkpoint, tasks_by_id(cfg, iteration),
                                                           nodes, cands, runtime)
        flip = _clip(flip, cfg)
        v = np.where(r > 0.5, 1.0 - flip, flip)
    depth = cands["depth"].to_numpy()
    prompts = read_shard(roots.prompts)
    conc = stored_concentration(prompts)
    v_root = planned_v(cfg, iteration, prompts["v_pred"].to_numpy(), conc)
    zv_groups, zv_trajectories = zero_variance_groups(nodes)
    alloc_cfg, grown = _allocation(cfg, roots), None
    if growing(alloc_cfg):  # adaptive groups: the rest of the budget grows the sampled prompts' groups
        plan, grown = grow_plan(alloc_cfg, prompts, v_root, conc, nodes, raw.trajectories, cands.height)
    else:
        plan = plan_prefixes(_root_plan(cfg, roots, prompts), v_root, v, r, depth,
                             np.maximum(cfg.env.max_turns - depth, 1), raw.trajectories, alloc_cfg,
                             np.random.default_rng(iteration_seed(cfg, iteration, "prefixes")),
                             zero_variance_groups=zv_groups, zero_variance_trajectories=zv_trajectories,
                             strata=stratum_labels(cfg.allocation.stratify, prompts["task"].to_list(),
                                                   prompts["difficulty"].to_list()),
                             prefix_strata=stratum_labels(cfg.allocation.stratify, cands["task"].to_list(),
                                                          cands["difficulty"].to_list()),
                             concentration=conc)
    alloc = pl.concat([pl.DataFrame({"node_id": cands["node_id"], "v_pred": v_node, "flip": flip, "r": r, "k": plan.k,
                                     "utility": prefix_utility(v, r, plan.k) if len(plan.k) else np.zeros(0),
                                     "kind": PREFIX}, schema=ALLOC_SCHEMA), *([] if grown is None else [grown])],
                      how="vertical_relaxed")
    refill = None
    if plan.wave_rollouts > 0:
        refill = str(write_parquet_atomic(prompts.with_columns(
            pl.Series("m_alloc", plan.second_wave),
            pl.Series("utility", root_values(cfg, v_root, conc, plan.second_wave))),
            ref.staging(iteration, "refill_prompts")))
    path = write_parquet_atomic(alloc, ref.staging(iteration, "prefix_alloc"))
    return PrefixAllocation(path=str(path), prefixes=cands.height, ext_budget=plan.budget,
                            ext_used=plan.continuations, branched=int((plan.k > 0).sum()), refill_prompts=refill,
                            refill_rollouts=plan.wave_rollouts, oracle_tokens=oracle_tokens,
                            grown=0 if grown is None else int(grown["k"].sum()), seconds=time.perf_counter() - t0)


def extend_and_refill(ref: RunRef, cfg: TrainConfig, iteration: int, checkpoint: str, raw: Generation,
                      prefixes: PrefixAllocation, runtime: Runtime) -> Extensions:
    """(5) K continuations from each chosen prefix (environment replayed, prefix KV shared), then
    the second root wave the plan bought with what they left (the refill): one shard of new nodes."""
    t0 = time.perf_counter()
    alloc = read_shard(prefixes.path).filter(pl.col("k") > 0)
    counts = dict(zip(alloc["node_id"].to_list(), alloc["k"].to_list(), strict=True))
    new = nodes_frame([])
    if counts:
        new = runtime.rollouts.extend(checkpoint, tasks_by_prompt=tasks_by_id(cfg, iteration),
                                         nodes=read_shard(raw.path), counts=counts,
                                         sampling=_sampling(cfg, iteration, "extend"), cfg=rollout_config(cfg),
                                         seed=iteration_seed(cfg, iteration, "extend"))
    # continuations of prefixes; those of roots (adaptive groups) are raw episodes of the prompt's group
    continuations = int((new["is_leaf"] & (new["origin"] == "extension")).sum() or 0) if new.height else 0
    if prefixes.refill_prompts:
        wave = _raw_rollouts(cfg, ref, iteration, checkpoint, read_shard(prefixes.refill_prompts), "raw-wave2",
                             runtime)
        new = pl.concat([new, wave], how="vertical_relaxed") if new.height else wave
    new = stamp_version(new, checkpoint_version(ref, checkpoint))
    gen = _generation(new, write_parquet_atomic(new, ref.staging(iteration, "extensions")), t0)
    return Extensions(**gen.model_dump(), continuations=continuations,
                      refill_trajectories=gen.trajectories - continuations)


def verify_rewards(ref: RunRef, cfg: TrainConfig, iteration: int, predictor: PredictorFit, roots: RootAllocation,
                   raw: Generation, prefixes: PrefixAllocation, extensions: Extensions, runtime: Runtime) -> Verified:
    """(6) Re-verify rewards, fill subtree rewards, prefix decisions and advantages; write the
    iteration's node, prompt and prediction shards (the rows behind the views)."""
    t0 = time.perf_counter()
    nodes = pl.concat([read_shard(raw.path), read_shard(extensions.path)], how="vertical_relaxed")
    nodes, mismatched = reverify(nodes, runtime.envs, tasks_by_id(cfg, iteration))
    alloc = read_shard(prefixes.path)
    nodes = with_prefix_decisions(nodes, prefix_decisions(alloc))
    prompts = read_shard(roots.prompts)
    nodes, prompts = with_growth(nodes, prompts, alloc)  # the episodes stage 4 grew, in the roots' groups
    nodes = compute_advantages(nodes, cfg.advantage)
    writer = ShardWriter(ref.home, ref.run_id, strategy=cfg.allocation.strategy)
    writer.write("nodes", nodes, stage="final", iteration=iteration)
    if prefixes.refill_prompts:  # the plan's second wave (it samples only prompts the first skipped)
        wave = read_shard(prefixes.refill_prompts)
        prompts = prompts.with_columns(pl.col("m_alloc") + wave["m_alloc"],
                                       pl.when(wave["m_alloc"] > 0).then(wave["utility"]).otherwise(pl.col("utility")))
    prompts = prompt_rows(prompts, nodes)
    writer.write("prompts", prompts, stage="final", iteration=iteration)
    predictions = prediction_rows(nodes).with_columns(
        pl.lit(predictor.outcome_version, dtype=pl.Int32).alias("outcome_version"))
    writer.write("predictions", predictions, stage="final", iteration=iteration)
    return Verified(nodes=str(writer.path("nodes", stage="final", iteration=iteration)),
                    predictor_metrics=prospective_metrics(nodes, load_predictor(predictor.path)),
                    confirmed_confident_share=confirmed_confident_share(prompts),
                    reward_mismatches=mismatched, seconds=time.perf_counter() - t0, **trajectory_metrics(nodes))


# ----------------------------------------------------------------------------- evaluate, record
def _sampled_rewards(cfg: TrainConfig, checkpoint: str, tasks, stage: str, runtime: Runtime) -> np.ndarray:
    """(tasks, eval_samples) rewards; the sampling seeds are fixed per config (not per checkpoint),
    so every checkpoint of a run is scored on the same episodes' randomness."""
    seed = iteration_seed(cfg, 0, stage)
    return runtime.evaluation.evaluate(checkpoint, tasks=tasks, samples=cfg.run.eval_samples,
                                     sampling=cfg.sampling.model_copy(update={"seed": bounded_seed(seed)}),
                                     cfg=rollout_config(cfg), seed=seed)


def evaluate(cfg: TrainConfig, checkpoint: str, runtime: Runtime) -> Evaluation:
    """Held-out accuracy (mean sampled reward) per family and overall; with ``run.probe_tasks``,
    also the reward on a fixed probe of training prompts."""
    t0 = time.perf_counter()
    tasks = heldout_pool(cfg)
    if not tasks or cfg.run.eval_tasks == 0:
        return Evaluation()
    rewards = _sampled_rewards(cfg, checkpoint, tasks, "eval", runtime)
    probe = probe_pool(cfg)
    probe_rewards = _sampled_rewards(cfg, checkpoint, probe, "probe", runtime) if probe else None
    return _evaluation(tasks, rewards, time.perf_counter() - t0, probe_rewards)


def _evaluation(tasks, rewards: np.ndarray, seconds: float, probe: np.ndarray | None = None) -> Evaluation:
    fam = np.array([t.family for t in tasks])
    cells = pl.DataFrame({"task": fam, "difficulty": [int(t.difficulty) for t in tasks],
                          "s": (rewards > 0.5).sum(axis=1), "n": np.full(len(tasks), rewards.shape[1])})
    cells = cells.group_by("task", "difficulty").agg(pl.col("s").sum(), pl.col("n").sum()).sort("task", "difficulty")
    return Evaluation(accuracy=float(rewards.mean()),
                      by_family={f: float(rewards[fam == f].mean()) for f in sorted(set(fam))},
                      cells=[tuple(r) for r in cells.iter_rows()], seconds=seconds, episodes=int(rewards.size),
                      probe_accuracy=None if probe is None else float(probe.mean()),
                      probe_episodes=0 if probe is None else int(probe.size),
                      per_prompt=[float(x) for x in rewards.mean(axis=1)])


def record_evaluation(ref: RunRef, cfg: TrainConfig, iteration: int, ev: Evaluation) -> None:
    """The ``evaluations`` rows of one evaluation after ``iteration`` iterations (0 = the warm start):
    held-out accuracy overall and per family, and the training probe's."""
    if ev.accuracy is None:
        return
    now = datetime.now(UTC).replace(tzinfo=None)
    rows = [("heldout", "all", ev.accuracy, ev.episodes)]
    rows += [("heldout", f, a, 0) for f, a in ev.by_family.items()]
    if ev.probe_accuracy is not None:
        rows.append(("probe", "all", ev.probe_accuracy, ev.probe_episodes))
    frame = pl.DataFrame({"strategy": cfg.allocation.strategy, "split": [r[0] for r in rows],
                          "family": [r[1] for r in rows], "accuracy": [float(r[2]) for r in rows],
                          "episodes": [int(r[3]) for r in rows], "seconds": ev.seconds, "created_at": now})
    ShardWriter(ref.home, ref.run_id).write("evaluations", frame, stage="final", iteration=iteration)


def record_iteration(ref: RunRef, cfg: TrainConfig, iteration: int, results: IterationResults,
                     accuracy: Evaluation, start: Evaluation | None = None) -> dict:
    """Write the iteration's summary row (budget, tokens, metrics, accuracy, stage timings) and
    the ``evaluations`` rows of the evaluation after it (and, ``start``, of the one before training)."""
    row = iteration_row(ref.run_id, cfg.allocation.strategy, iteration, _allocation(cfg, results.roots).budget_total,
                        results, accuracy)
    ShardWriter(ref.home, ref.run_id).write("iterations", pl.DataFrame([row]), stage="final", iteration=iteration)
    if start is not None:
        record_evaluation(ref, cfg, 0, start)
    record_evaluation(ref, cfg, iteration + 1, accuracy)
    return row
