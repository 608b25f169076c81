"""The seven stages of ``trace_core.stages.iteration`` called directly, in flow order, on the shipped
tiny policy (no Prefect): each returns its frozen record and writes what the next one reads."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from tests.iteration_stages import run_until_verified
from trace_core.config import load_train_config
from trace_core.home.shards import ShardWriter
from trace_core.policy.model import TINY_WARM_DIR
from trace_core.runtime import Runtime
from trace_core.stages import iteration as it
from trace_core.stages.results import (
    Evaluation,
    Generation,
    IterationResults,
    PolicyUpdate,
    RootAllocation,
    Verified,
)
from trace_core.stages.run import RunRef, initial_checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# run.threads=1: small-ci's two torch threads wait for a core on a shared box (the stages 37 s -> 6 s)
SETS = ["run.eval_tasks=12", "allocation.budget_total=48", "run.threads=1"]
pytestmark = pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                reason="shipped tiny checkpoint missing: run `trace-rl warmup`")


@pytest.fixture(scope="module")
def runtime():
    """The module's runtime (environments, live policy, local rollouts), as a run has one."""
    with Runtime(load_train_config(CONFIGS / "small-ci.yaml", SETS)) as rt:
        yield rt


@pytest.fixture(scope="module")
def one_iteration(tmp_path_factory, runtime):
    RT = runtime
    cfg = load_train_config(CONFIGS / "small-ci.yaml", SETS)
    ref = RunRef(str(tmp_path_factory.mktemp("home")), "it")
    ckpt = initial_checkpoint(cfg)
    stages = run_until_verified(ref, cfg, ckpt, it.evaluate(cfg, ckpt, RT), RT)
    results = IterationResults(**stages, update=it.update_policy(ref, cfg, 0, ckpt, stages["verified"], RT))
    return cfg, ref, results


def test_root_allocation_respects_the_root_budget(one_iteration):
    cfg, _, res = one_iteration
    assert isinstance(res.roots, RootAllocation)
    prompts = pl.read_parquet(res.roots.prompts)
    assert prompts.height == res.roots.candidates == cfg.run.candidate_pool
    m = prompts["m_alloc"].to_numpy()
    assert ((m == 0) | (m >= cfg.allocation.knobs().min_active)).all()
    assert int(m.sum()) == res.roots.root_budget_used <= cfg.allocation.budget_total


def test_raw_rollouts_follow_the_allocation(one_iteration):
    _, _, res = one_iteration
    nodes = pl.read_parquet(res.raw.path)
    prompts = pl.read_parquet(res.roots.prompts).filter(pl.col("m_alloc") > 0)
    per_prompt = nodes.filter(pl.col("is_leaf")).group_by("prompt_id").len()
    assert dict(per_prompt.iter_rows()) == dict(prompts.select("prompt_id", "m_alloc").iter_rows())
    assert isinstance(res.raw, Generation) and res.raw.trajectories == int(prompts["m_alloc"].sum())


def test_extensions_spend_what_is_left(one_iteration):
    cfg, _, res = one_iteration
    assert res.prefixes.ext_budget == cfg.allocation.budget_total - res.raw.trajectories
    assert res.prefixes.ext_used <= res.prefixes.ext_budget
    ext = pl.read_parquet(res.extensions.path)
    assert res.extensions.trajectories == (int(ext["is_leaf"].sum()) if ext.height else 0)
    assert res.extensions.continuations == res.prefixes.ext_used
    assert res.extensions.refill_trajectories == res.prefixes.refill_rollouts


def test_verified_shard_and_metrics(one_iteration):
    cfg, _, res = one_iteration
    assert isinstance(res.verified, Verified)
    nodes = pl.read_parquet(res.verified.nodes)
    leaves = nodes.filter(pl.col("is_leaf"))
    assert leaves["reward"].null_count() == 0 and leaves["reward_reason"].null_count() == 0
    generated = res.raw.trajectories + res.extensions.trajectories
    assert res.verified.trajectories == generated <= cfg.allocation.budget_total
    assert 0.0 <= res.verified.effective_ratio <= 1.0
    assert res.verified.effective + res.verified.wasted == res.verified.trajectories


def test_update_writes_the_next_checkpoint(one_iteration):
    _, ref, res = one_iteration
    assert isinstance(res.update, PolicyUpdate)
    assert Path(res.update.checkpoint) == ref.checkpoint(0)
    assert (Path(res.update.checkpoint) / "model.safetensors").is_file()
    # sequences with a non-zero advantage are trained on; with none, the step is skipped
    assert (res.update.loss is not None) == (res.update.stats.sequences > 0)
    assert (res.update.stats.sequences > 0) == (res.verified.effective > 0)


def test_records_round_trip_as_json(one_iteration):
    _, _, res = one_iteration
    again = IterationResults.model_validate_json(res.model_dump_json())
    assert again == res
    with pytest.raises(ValidationError):
        res.raw.trajectories = 0  # frozen


def test_evaluate_and_record(one_iteration, runtime):
    cfg, ref, res = one_iteration
    ev = it.evaluate(cfg, res.update.checkpoint, runtime)
    assert isinstance(ev, Evaluation) and 0.0 <= ev.accuracy <= 1.0
    assert sum(n for *_, n in ev.cells) == len(it.heldout_pool(cfg)) * cfg.run.eval_samples
    row = it.record_iteration(ref, cfg, 0, res, ev)
    assert row["budget_used"] == res.verified.trajectories and row["accuracy"] == ev.accuracy


def test_one_price_across_the_stages(one_iteration):
    """trace (root_share unset): continuations only where they beat the roots' price; what the
    prefix stage leaves goes to a second wave over prompts the first wave skipped."""
    cfg, _, res = one_iteration
    assert cfg.allocation.knobs().root_share is None
    assert res.roots.root_budget < cfg.allocation.budget_total  # a reserve was held back
    alloc = pl.read_parquet(res.prefixes.path)
    assert {"v_pred", "flip", "r", "k"} <= set(alloc.columns)
    assert res.raw.trajectories + res.prefixes.ext_used + res.prefixes.refill_rollouts <= cfg.allocation.budget_total
    if res.prefixes.refill_prompts:
        first = pl.read_parquet(res.roots.prompts)
        wave = pl.read_parquet(res.prefixes.refill_prompts)
        both = (first["m_alloc"] > 0) & (wave["m_alloc"] > 0)
        assert not both.any()
        assert res.extensions.refill_trajectories == int(wave["m_alloc"].sum())


def test_equal_tokens_budget(one_iteration):
    """allocation.budget_tokens: iteration 1's trajectory budget is what the tokens still owed buy
    at iteration 0's tokens per trajectory (roots and continuations priced alike), and every
    stage of the iteration keeps to it."""
    cfg, ref, res = one_iteration
    spent, price = it.spent_tokens(ref, 1)
    nodes = pl.read_parquet(res.verified.nodes)
    assert spent == int(nodes["new_tokens"].sum()) == res.raw.tokens + res.extensions.tokens
    assert price == pytest.approx(spent / int(nodes["is_leaf"].sum()))
    assert it.spent_tokens(ref, 0) == (0, None)
    for owed_factor in (1.0, 1.6):  # under-spent at iteration 0: iteration 1 buys more (up to 2x)
        target = int(spent * owed_factor)
        tcfg = cfg.model_copy(update={"allocation": cfg.allocation.model_copy(update={"budget_tokens": target})})
        roots = it.allocate_roots(ref, tcfg, 1, res.predictor)
        want = min(max((2 * target - spent) / price, 0.5 * target / price), 2 * target / price)
        assert roots.budget == int(round(want))
        assert roots.root_budget_used <= roots.root_budget <= roots.budget
    assert it.allocate_roots(ref, cfg, 1, res.predictor).budget == cfg.allocation.budget_total


def test_stratified_plan_gives_each_family_its_share(one_iteration, runtime):
    """allocation.stratify=task on real candidates and raw rollouts: the roots, the continuations and
    the second wave of each family stay within its share of the budget (its share of the pool)."""
    from trace_core.allocation.planner import split_budget

    cfg, ref, res = one_iteration
    scfg = cfg.model_copy(update={"allocation": cfg.allocation.model_copy(update={"stratify": "task"})})
    roots = it.allocate_roots(ref, scfg, 0, res.predictor)
    prompts = pl.read_parquet(roots.prompts)
    fams = list(dict.fromkeys(prompts["task"].to_list()))
    share = dict(zip(fams, split_budget(scfg.allocation.budget_total,
                                        [prompts.filter(pl.col("task") == f).height for f in fams]), strict=True))
    raw = it.generate_raw_rollouts(ref, scfg, 0, initial_checkpoint(scfg), roots, runtime)
    prefixes = it.score_prefixes(ref, scfg, 0, res.predictor, roots, raw)
    nodes = pl.read_parquet(raw.path)
    k = pl.read_parquet(prefixes.path).join(nodes.select("node_id", "task"), on="node_id")
    wave = pl.read_parquet(prefixes.refill_prompts) if prefixes.refill_prompts else prompts.with_columns(m_alloc=0)
    for f in fams:
        spent = (prompts.filter(pl.col("task") == f)["m_alloc"].sum() + wave.filter(pl.col("task") == f)["m_alloc"].sum()
                 + k.filter(pl.col("task") == f)["k"].sum())
        assert spent <= share[f], (f, spent, share)


def test_thompson_roots_plan_on_posterior_draws_and_record_the_mean(one_iteration, runtime):
    """allocation.trace.root_thompson on real candidates: the recorded v_pred stays the predictor's
    mean (what is scored), the plan and its utility follow one seeded draw per candidate, and the
    prefix stage redraws the same values for the second wave."""
    import numpy as np

    from trace_core.stages.root_values import planned_v
    from trace_core.utility import root_utility

    cfg, ref, res = one_iteration
    tcfg = cfg.model_copy(update={"allocation": cfg.allocation.with_knobs("trace", root_thompson=True)})
    off = pl.read_parquet(it.allocate_roots(ref, cfg, 0, res.predictor).prompts)
    roots = it.allocate_roots(ref, tcfg, 0, res.predictor)
    on = pl.read_parquet(roots.prompts)
    assert on["v_pred"].to_list() == off["v_pred"].to_list()
    conc = on["v_concentration"].to_numpy()
    assert not np.isnan(conc).any(), "the predictor has a prior after iteration 0's evaluation"
    drawn = planned_v(tcfg, 0, on["v_pred"].to_numpy(), conc)
    assert not np.allclose(drawn, on["v_pred"].to_numpy())
    assert np.allclose(on["utility"].to_numpy(), root_utility(drawn, on["m_alloc"].to_numpy()), atol=1e-6)
    assert roots.root_budget_used <= roots.root_budget
    raw = it.generate_raw_rollouts(ref, tcfg, 0, initial_checkpoint(tcfg), roots, runtime)
    prefixes = it.score_prefixes(ref, tcfg, 0, res.predictor, roots, raw)
    if prefixes.refill_prompts:
        wave = pl.read_parquet(prefixes.refill_prompts)
        assert np.allclose(wave["utility"].to_numpy(), root_utility(drawn, wave["m_alloc"].to_numpy()), atol=1e-6)


def test_reference_scores_rank_each_candidates_demonstration_within_its_cell(one_iteration, runtime):
    """predictor.reference on real candidates and the shipped policy: every synthetic candidate's
    demonstration is scored (one forward pass each) and its within-cell rank recorded in the prompts
    shard; before the predictor has fitted a term the predictions are those of the run without it."""
    import numpy as np

    cfg, ref, res = one_iteration
    rcfg = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={
        "reference": cfg.predictor.reference.model_copy(update={"enabled": True})})})
    off = pl.read_parquet(it.allocate_roots(ref, cfg, 0, res.predictor).prompts)
    assert off["ref_score"].null_count() == off.height, "off: nothing scored"
    on = pl.read_parquet(it.allocate_roots(ref, rcfg, 0, res.predictor, initial_checkpoint(rcfg), runtime).prompts)
    # small-ci's env.max_turns cuts the longest math demonstrations short: those stay unscored
    assert on["ref_score"].null_count() <= on.height // 4
    on = on.filter(pl.col("ref_score").is_not_null())
    s = on["ref_score"].to_numpy()
    assert s.min() >= -0.5 and s.max() <= 0.5
    cells = on.group_by("task", "difficulty").agg(pl.col("ref_score").mean().alias("mean"), pl.len().alias("n"))
    assert np.allclose(cells["mean"].to_numpy(), 0.0, atol=1e-6), "a rank within each cell centres on 0"
    off = off.filter(pl.col("prompt_id").is_in(on["prompt_id"].implode()))
    assert on["v_pred"].to_list() == off["v_pred"].to_list(), "no term fitted yet at iteration 0"
    with pytest.raises(ValueError, match="checkpoint and runtime"):
        it.allocate_roots(ref, rcfg, 0, res.predictor)


def test_reference_scores_need_the_synchronous_flow():
    from trace_core.config.io import ConfigError

    with pytest.raises(ConfigError, match="max_staleness"):
        load_train_config(CONFIGS / "small-ci.yaml", SETS + ["predictor.reference.enabled=true", "run.max_staleness=1"])


def test_history_shift_weights_a_prompts_record_by_the_rollouts_policy(one_iteration, runtime):
    """predictor.history_shift on iteration 0's real rollouts: under the weights that sampled them the
    importance weights are 1 (the stored behaviour log-probs are the policy's), so no record moves;
    under the updated weights they differ, and a record holding both outcomes gets a finite shift,
    one outcome 0, an unseen prompt none. Before the slope has rows, predictions are unchanged."""
    import numpy as np

    from trace_core.policy.update import build_sequences
    from trace_core.stages.history import history_nodes
    from trace_core.stages.history_shift import log_weights, recent_raw, shift_features

    cfg, ref, res = one_iteration
    hcfg = cfg.predictor.history_shift.model_copy(update={"enabled": True})
    history = history_nodes(ref, 1)
    tasks = it.tasks_by_id(cfg, 0)
    leaves = history.filter(pl.col("is_leaf") & (pl.col("origin") == "raw"))
    rates = leaves.group_by("prompt_id").agg((pl.col("reward") > 0.5).mean().alias("rate"))
    ids = rates["prompt_id"].to_list() + ["never-sampled"]
    messages = {p: runtime.envs[tasks[p].family].reset(tasks[p]).messages() for p in ids[:-1]}
    nodes = recent_raw(history, ids[:-1], hcfg.max_trajectories)
    assert nodes.height, "small-ci's first iteration has records with both outcomes"
    before = runtime.live.get(initial_checkpoint(cfg), fresh=True)  # the fixture's update trained the held one
    seqs = build_sequences(nodes, before.chat, messages, skip_zero_advantage=False)
    same = log_weights(before.model, seqs, before.tokenizer.pad_token_id, cfg.sampling.temperature)
    assert np.abs(same).max() < 1e-2, "the behaviour policy's own weights are 1"
    after = runtime.live.get(res.update.checkpoint)
    moved = log_weights(after.model, seqs, after.tokenizer.pad_token_id, cfg.sampling.temperature)
    assert np.abs(moved).max() > 1e-2, "an update moves the weights"
    d = shift_features(after, history, ids, messages, hcfg, cfg.sampling.temperature)
    mixed = ((rates["rate"] > 0) & (rates["rate"] < 1)).to_numpy()
    assert np.isnan(d[-1]) and (d[:-1][~mixed] == 0).all()
    assert np.isfinite(d[:-1][mixed]).all() and (d[:-1][mixed] != 0).any()
    assert np.abs(d[:-1]).max() <= hcfg.max_shift
    scfg = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"history_shift": hcfg})})
    pred = it.refresh_predictor(ref, scfg, 1)
    on = pl.read_parquet(it.allocate_roots(ref, scfg, 1, pred, res.update.checkpoint, runtime).prompts)
    recorded = on["prompt_id"].is_in(leaves["prompt_id"].implode())
    assert on.filter(recorded)["is_shift"].null_count() == 0, "a candidate with a record is scored"
    assert on.filter(~recorded)["is_shift"].null_count() == on.filter(~recorded).height
    assert on["v_pred"].to_list() == on["v_unshifted"].to_list(), "no slope before min_rows outcomes"


def test_adaptive_groups_grow_the_sampled_prompts_by_their_first_episodes(one_iteration, runtime):
    """trace.grow_first on real rollouts: stage 2 samples pairs on its share of the budget, stage 4
    buys more episodes of the same prompts where the pairs disagree first, stage 5 plays them from
    the root as raw episodes of the prompt's group, and stage 6 counts them in the group."""
    cfg, ref, res = one_iteration
    gcfg = cfg.model_copy(update={"allocation": cfg.allocation.with_knobs("trace", grow_first=2, max_per_prompt=4)})
    ref = RunRef(ref.home, "it-grow")
    ckpt = initial_checkpoint(gcfg)
    roots = it.allocate_roots(ref, gcfg, 0, res.predictor)
    m = pl.read_parquet(roots.prompts)["m_alloc"].to_numpy()
    assert set(m.tolist()) <= {0, 2} and m.sum() == roots.root_budget_used <= round(0.67 * 48)
    raw = it.generate_raw_rollouts(ref, gcfg, 0, ckpt, roots, runtime)
    prefixes = it.score_prefixes(ref, gcfg, 0, res.predictor, roots, raw)
    alloc = pl.read_parquet(prefixes.path)
    grown = alloc.filter(pl.col("kind") == "root")
    assert grown.height == int((m > 0).sum()) and (alloc.filter(pl.col("kind") == "prefix")["k"] == 0).all()
    assert prefixes.grown == int(grown["k"].sum()) == 48 - raw.trajectories  # the whole rest of the budget
    first = pl.read_parquet(raw.path).filter(pl.col("is_leaf")).group_by("prompt_id").agg(
        pl.col("reward").min().alias("lo"), pl.col("reward").max().alias("hi"))
    roots_of = pl.read_parquet(raw.path).filter(pl.col("depth") == 0).select("node_id", "prompt_id")
    k = grown.join(roots_of, on="node_id").join(first, on="prompt_id")
    mixed = k.filter(pl.col("lo") != pl.col("hi"))
    if mixed.height and mixed.height * 2 <= prefixes.grown:  # every disagreeing pair grows to the cap first
        assert (mixed["k"] == 2).all()
    ext = it.extend_and_refill(ref, gcfg, 0, ckpt, raw, prefixes, runtime)
    new = pl.read_parquet(ext.path)
    assert ext.continuations == 0 and ext.refill_trajectories == prefixes.grown
    assert (new["origin"] == "raw").all()
    starts = new.filter(pl.col("depth") == 1)
    assert set(starts["parent_id"]) <= set(roots_of["node_id"])
    ver = it.verify_rewards(ref, gcfg, 0, res.predictor, roots, raw, prefixes, ext, runtime)
    nodes = pl.read_parquet(ver.nodes)
    groups = nodes.filter(pl.col("is_leaf")).group_by("prompt_id").len()
    root_rows = nodes.filter(pl.col("depth") == 0).join(groups, on="prompt_id")
    assert (root_rows["alloc_children"] == root_rows["len"]).all()  # one group per prompt, grown ones included
    assert int(nodes["is_leaf"].sum()) == 48
    prompts = pl.read_parquet(ShardWriter(ref.home, ref.run_id).path("prompts", stage="final", iteration=0))
    chosen = prompts.filter(pl.col("m_alloc") > 0)
    assert (chosen["m_alloc"] == chosen["n_total"]).all() and int(chosen["m_alloc"].sum()) == 48
