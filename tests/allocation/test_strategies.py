"""Strategy registry and the budget each strategy spends."""

import numpy as np
import pytest
from pydantic import ValidationError

from trace_core.allocation import allocate_prefixes, allocate_roots
from trace_core.allocation.config import SECTIONS, AllocationConfig, section_key
from trace_core.allocation.strategies import (
    Strategy,
    get_strategy,
    random_prefixes,
    register_strategy,
    strategy_names,
)

ALL = ["dapo", "grpo", "pcl", "trace", "trace-prefix", "trace-root", "treepo"]
#: full groups and a wide reserve (the defaults before breadth): the mechanics below are pinned on them
FULL = dict(root_objective="trajectories", min_active=2, ext_reserve=0.25, max_reserve=0.5, max_per_node=8)


def alloc(name: str = "trace", **fields) -> AllocationConfig:
    """Settings of strategy ``name``: the shared fields at the top, the rest in its section (a
    knob ``name`` does not have is left out: the parametrised tests pass one set to all)."""
    shared = {k: v for k, v in fields.items() if k in AllocationConfig.model_fields}
    rest = {k: v for k, v in fields.items() if k not in shared}
    assert all(any(k in m.model_fields for m in SECTIONS.values()) for k in rest), rest
    own = {k: v for k, v in rest.items() if k in SECTIONS[name].model_fields}
    return AllocationConfig(strategy=name, **shared, **({section_key(name): own} if own else {}))


def with_knobs(cfg: AllocationConfig, **updates) -> AllocationConfig:
    """``cfg`` with ``updates`` applied to its strategy's section (knobs it does not have left out)."""
    own = SECTIONS[cfg.strategy].model_fields
    return cfg.with_knobs(cfg.strategy, **{k: v for k, v in updates.items() if k in own})


def test_registry_names_duplicates_and_unknown():
    assert set(ALL) <= set(strategy_names())
    with pytest.raises(ValueError, match="already registered"):
        register_strategy("grpo")(type("Again", (Strategy,), {}))
    with pytest.raises(KeyError, match="known: .*grpo"):
        get_strategy("nope")
    with pytest.raises(ValidationError, match="max_per_prompt"):
        alloc(max_per_prompt=2, min_active=3)
    with pytest.raises(ValidationError, match="root_share"):
        alloc(root_share=1.5)
    with pytest.raises(ValidationError, match="extra"):
        AllocationConfig(budjet_total=3)


def _spend(name, cfg, seed=0):
    rng = np.random.default_rng(seed)
    s = get_strategy(name)
    v = rng.random(200)
    m = s.allocate_roots(v, cfg, rng)
    R = int(m.sum())
    T = 4
    P = R * (T - 1)
    depth = np.tile(np.arange(1, T), R)
    k = s.allocate_prefixes(rng.random(P), rng.integers(0, 2, P).astype(float), depth, T - depth,
                            cfg.budget_total - R, cfg, rng)
    return s, m, k


@pytest.mark.parametrize("name", ALL)
def test_every_strategy_spends_the_same_budget(name):
    cfg = alloc(name, budget_total=256, root_share=0.5)
    s, m, k = _spend(name, cfg)
    knobs = cfg.knobs()
    lo, hi = getattr(knobs, "min_active", cfg.group_size), getattr(knobs, "max_per_prompt", cfg.group_size)
    assert np.all((m == 0) | ((m >= lo) & (m <= hi)))
    assert m.sum() <= s.root_budget(cfg)
    assert m.sum() + k.sum() == cfg.budget_total  # these pools are large enough to use it all
    assert np.all(k <= getattr(knobs, "max_per_node", 0))
    if not s.has_extensions:
        assert k.sum() == 0 and m.sum() == cfg.budget_total
    else:
        assert m.sum() <= 128


def test_uniform_takes_the_stream_head_and_pcl_the_middle():
    cfg = alloc("grpo", budget_total=24, group_size=8)
    v = np.array([0.0, 1.0, 0.5, 0.45, 0.9, 0.52])
    assert get_strategy("grpo").allocate_roots(v, cfg, None).tolist() == [8, 8, 8, 0, 0, 0]
    assert get_strategy("pcl").allocate_roots(v, cfg, None).tolist() == [0, 0, 8, 8, 0, 8]
    assert get_strategy("dapo").drop_zero_variance and not get_strategy("grpo").drop_zero_variance


def test_trace_roots_skip_hopeless_prompts():
    cfg = alloc("trace", budget_total=16, root_share=1.0)
    v = np.array([0.0, 1.0, 0.5, 0.5])
    assert get_strategy("trace").allocate_roots(v, cfg, None).tolist() == [0, 0, 8, 8]


def test_random_prefixes_is_seeded_and_bounded():
    a = random_prefixes(10, 13, 2, 3, np.random.default_rng(1))
    b = random_prefixes(10, 13, 2, 3, np.random.default_rng(1))
    assert a.tolist() == b.tolist() and a.sum() == 13 and a.max() <= 3
    assert random_prefixes(4, 100, 2, 3, np.random.default_rng(0)).tolist() == [3, 3, 3, 3]
    assert random_prefixes(0, 5, 2, 3, np.random.default_rng(0)).tolist() == []


def test_token_budget_buys_more_short_continuations():
    cfg = alloc("trace", budget_total=64, token_budget=True)
    s = get_strategy("trace")
    v = np.full(6, 0.5)
    r = np.ones(6)
    remaining = np.array([4, 4, 4, 1, 1, 1])
    k = s.allocate_prefixes(v, r, 5 - remaining, remaining, 2, cfg, None)
    assert (k * remaining).sum() <= 2 * 4
    assert k.sum() > 2  # more than two continuations with a 2-episode budget


def test_defaults_are_the_measured_breadth_setting_and_objectives_are_validated():
    cfg = AllocationConfig().knobs()
    assert cfg.root_objective == "groups" and cfg.prefix_objective == "trajectories"
    assert (cfg.min_active, cfg.max_reserve, cfg.ext_reserve, cfg.max_per_node) == (4, 0.1, 0.1, 4)
    with pytest.raises(ValidationError, match="root_objective"):
        alloc(root_objective="rollouts")
    with pytest.raises(ValidationError, match="prefix_objective"):
        alloc(prefix_objective="group")
    fields = SECTIONS["trace"].model_fields
    assert "trajectories" in fields["root_objective"].description
    assert "trajectories" in fields["prefix_objective"].description


@pytest.mark.parametrize("name", ["trace", "trace-root", "trace-prefix"])
def test_trace_strategies_pass_the_objectives_through(name):
    rng = np.random.default_rng(3)
    v, vp, r = rng.random(64), rng.random(90), rng.integers(0, 2, 90).astype(float)
    remaining = rng.integers(1, 5, 90)
    cfg = alloc(name, budget_total=96, **FULL)
    s = get_strategy(name)
    m = s.allocate_roots(v, cfg, np.random.default_rng(0))
    if name != "trace-prefix":
        expect = allocate_roots(v, s.root_budget(cfg), max_per_prompt=8, min_active=2, objective="trajectories")
        assert m.tolist() == expect.tolist()
        assert m.tolist() != allocate_roots(v, s.root_budget(cfg)).tolist()  # the objective matters here
    for token_budget in (False, True):
        c = with_knobs(cfg, token_budget=token_budget)
        k = s.allocate_prefixes(vp, r, 5 - remaining, remaining, 30, c, np.random.default_rng(0))
        if name != "trace-root":
            cost = dict(cost=remaining.astype(float)) if token_budget else {}
            budget = 30 * remaining.max() if token_budget else 30
            expect = allocate_prefixes(vp, r, budget, max_per_node=8, objective="trajectories", **cost)
            assert k.tolist() == expect.tolist()


def test_trace_one_price_budget_split():
    """root_share unset: trace holds a reserve (ext_reserve at iteration 0, then what the last
    iteration bought, within [min_reserve, max_reserve]); a set root_share fixes the split; the
    fixed-split strategies use 0.5."""
    trace, treepo = get_strategy("trace"), get_strategy("treepo")
    cfg = alloc("trace", budget_total=200, **FULL)
    assert trace.root_budget(cfg) == 150  # ext_reserve 0.25
    assert trace.root_budget(cfg, reserve=60) == 140
    assert trace.root_budget(cfg, reserve=0) == 180  # min_reserve 0.1
    assert trace.root_budget(cfg, reserve=500) == 100  # max_reserve 0.5
    assert trace.root_budget(with_knobs(cfg, root_share=0.8), reserve=60) == 160
    assert treepo.root_budget(cfg) == 100 and get_strategy("grpo").root_budget(cfg) == 200


def test_trace_price_gates_continuations_and_leftover_goes_to_a_second_wave():
    rng = np.random.default_rng(5)
    trace = get_strategy("trace")
    cfg = alloc("trace", budget_total=96, **FULL)
    v = rng.random(40)
    m = trace.allocate_roots(v, cfg, rng, budget=64)
    price = trace.root_threshold(v, m, cfg)
    assert price > 0
    assert trace.root_threshold(v, m, with_knobs(cfg, root_share=0.5)) == 0.0
    r = rng.integers(0, 2, 120).astype(float)
    vp = np.where(r > 0.5, 1 - 0.15 * rng.random(120), 0.15 * rng.random(120))  # flips are rare
    free = trace.allocate_prefixes(vp, r, np.ones(120), np.ones(120), 32, cfg, rng)
    priced = trace.allocate_prefixes(vp, r, np.ones(120), np.ones(120), 32, cfg, rng, min_gain=price)
    assert priced.sum() <= free.sum() and priced.sum() < 32
    left = 96 - int(m.sum()) - int(priced.sum())
    m2, extra = trace.spend_leftover(v, m > 0, vp, r, priced, left, cfg)
    assert not ((m > 0) & (m2 > 0)).any() and 0 < m2.sum() + extra.sum() <= left
    assert (priced + extra <= cfg.knobs().max_per_node).all()
    m0, e0 = get_strategy("trace-root").spend_leftover(v, m > 0, vp, r, priced, left, cfg)
    assert m0.sum() == e0.sum() == 0


def test_leftover_goes_where_it_is_worth_most():
    """Sure prompts (v near 0 or 1) lose to a prefix that flips half the time, and vice versa."""
    trace = get_strategy("trace")
    cfg = alloc("trace", budget_total=64, max_per_prompt=8, max_per_node=4)
    sure, doubtful = np.array([0.02, 0.98, 0.5]), np.array([0.5])
    r = np.array([1.0])
    m2, extra = trace.spend_leftover(sure, np.array([False, False, True]), doubtful, r, np.array([0]), 4, cfg)
    assert extra.tolist() == [4] and m2.sum() == 0
    m2, extra = trace.spend_leftover(np.array([0.5, 0.5]), np.array([False, False]), np.array([0.99]), r,
                                     np.array([0]), 8, cfg)
    assert m2.sum() == 8 and extra.sum() == 0


def test_split_budget_is_proportional_and_exact():
    from trace_core.allocation.planner import split_budget

    assert split_budget(768, [128, 128, 128]).tolist() == [256, 256, 256]
    assert split_budget(10, [1, 1, 1]).tolist() == [4, 3, 3]  # largest remainder, ties to the first
    assert split_budget(7, [0, 5, 2]).tolist() == [0, 5, 2]
    assert split_budget(5, []).tolist() == []


def _skewed_pool(rng, n=120):
    """One family (qa) whose prompts all sit near v = 0.5 and two (math, fc) of sure prompts, with a
    few doubtful ones: unstratified TRACE spends nearly everything on qa."""
    fam = np.array(["qa", "math", "fc"] * (n // 3))
    v = np.where(fam == "qa", 0.45 + 0.1 * rng.random(n), np.where(rng.random(n) < 0.8, 0.97, 0.6))
    return v, fam


@pytest.mark.parametrize("name", ["trace", "trace-root", "pcl"])
def test_stratify_by_task_gives_every_family_its_share(name):
    from trace_core.allocation.planner import plan_roots

    rng = np.random.default_rng(0)
    v, fam = _skewed_pool(rng)
    cfg = alloc(name, budget_total=120, group_size=4, max_per_prompt=4)
    flat = plan_roots(v, cfg, np.random.default_rng(1), strata=fam.tolist())  # stratify none: labels ignored
    split = plan_roots(v, cfg.model_copy(update={"stratify": "task"}), np.random.default_rng(1), strata=fam.tolist())
    share = {f: split.m[fam == f].sum() for f in ("qa", "math", "fc")}
    assert flat.m[fam == "qa"].sum() > 0.8 * flat.used  # the skew stratification removes
    assert all(share[f] > 0.2 * split.used for f in share), share
    assert split.used <= split.budget <= cfg.budget_total
    assert (split.m[(fam == "math") & (v > 0.9)] == 0).sum() >= 1  # still chooses within a family


def test_stratified_prefix_plan_spends_each_share_within_its_stratum():
    from trace_core.allocation.planner import plan_prefixes, plan_roots

    rng = np.random.default_rng(3)
    v, fam = _skewed_pool(rng)
    cfg = alloc("trace", budget_total=120, max_per_prompt=4, stratify="task")
    roots = plan_roots(v, cfg, rng, strata=fam.tolist())
    owner = np.repeat(np.arange(len(v)), roots.m)  # one open prefix per raw rollout
    r = (rng.random(owner.size) < v[owner]).astype(float)
    vp = np.where(r > 0.5, 0.7, 0.3)
    plan = plan_prefixes(roots, v, vp, r, np.ones(owner.size), np.ones(owner.size), int(roots.m.sum()), cfg, rng,
                         strata=fam.tolist(), prefix_strata=fam[owner].tolist())
    for f in ("qa", "math", "fc"):
        spent = roots.m[fam == f].sum() + plan.second_wave[fam == f].sum() + plan.k[fam[owner] == f].sum()
        assert spent <= 40, (f, spent)  # its third of 120, no more
    assert plan.continuations + plan.wave_rollouts <= plan.budget
    assert not ((roots.m > 0) & (plan.second_wave > 0)).any()
    with pytest.raises(ValueError, match="prefix_strata"):
        plan_prefixes(roots, v, vp, r, np.ones(owner.size), np.ones(owner.size), int(roots.m.sum()), cfg, rng,
                      strata=fam.tolist(), prefix_strata=["qa"])


def test_value_shares_move_a_solved_familys_budget_to_the_doubtful_ones():
    """``value_shares`` 1: each family's share follows its summed 4v(1 - v); 0.5 halfway; the prefix
    stage splits the budget the same way as the root stage did."""
    from trace_core.allocation.planner import plan_prefixes, plan_roots, strata_groups, stratum_budgets

    rng = np.random.default_rng(3)
    v, fam = _skewed_pool(rng)
    base = alloc("trace", budget_total=120, max_per_prompt=4, stratify="task")
    groups = strata_groups(base, get_strategy("trace"), fam.tolist(), len(v))
    assert stratum_budgets(base, v, groups).tolist() == [40, 40, 40]  # qa, math, fc: their candidates
    w = {f: float(np.sum(4 * v[fam == f] * (1 - v[fam == f]))) for f in ("qa", "math", "fc")}
    full = stratum_budgets(base.model_copy(update={"value_shares": 1.0}), v, groups)
    assert abs(full[0] - 120 * w["qa"] / sum(w.values())) <= 1 and full.sum() == 120
    half = stratum_budgets(base.model_copy(update={"value_shares": 0.5}), v, groups)
    assert full[0] > half[0] > 40 and half.sum() == 120
    cfg = base.model_copy(update={"value_shares": 1.0})
    roots = plan_roots(v, cfg, rng, strata=fam.tolist())
    owner = np.repeat(np.arange(len(v)), roots.m)
    r = (rng.random(owner.size) < v[owner]).astype(float)
    plan = plan_prefixes(roots, v, np.where(r > 0.5, 0.7, 0.3), r, np.ones(owner.size), np.ones(owner.size),
                         int(roots.m.sum()), cfg, rng, strata=fam.tolist(), prefix_strata=fam[owner].tolist())
    for f, b in zip(("qa", "math", "fc"), full, strict=True):
        spent = roots.m[fam == f].sum() + plan.second_wave[fam == f].sum() + plan.k[fam[owner] == f].sum()
        assert spent <= b, (f, spent, b)
    with pytest.raises(ValidationError):
        alloc("trace", value_shares=1.5)


def test_uniform_strategies_ignore_stratify():
    from trace_core.allocation.planner import plan_roots

    v, fam = _skewed_pool(np.random.default_rng(0))
    for name in ("grpo", "dapo", "treepo"):
        cfg = alloc(name, budget_total=64, group_size=4)
        a = plan_roots(v, cfg, np.random.default_rng(1), strata=fam.tolist())
        b = plan_roots(v, cfg.model_copy(update={"stratify": "task"}), np.random.default_rng(1), strata=fam.tolist())
        assert a.m.tolist() == b.m.tolist()


@pytest.mark.parametrize("stratify", ["none", "task"])
def test_trace_refill_buys_the_zero_variance_trajectories_again_where_the_root_rule_values_them(stratify):
    """``trace.refill``: the second wave gains exactly the zero-variance groups' trajectories, paid on
    top of B, on candidates not yet sampled, and the doubtful ones before the sure ones (dapo takes
    the stream's next); off (the default), the plan is the one without it."""
    from trace_core.allocation.planner import plan_prefixes, plan_roots

    rng = np.random.default_rng(5)
    v, fam = _skewed_pool(rng)
    strata = None if stratify == "none" else fam.tolist()
    off = alloc("trace", budget_total=60, max_per_prompt=4, **({} if stratify == "none" else {"stratify": stratify}))
    on = with_knobs(off, refill=True)
    roots = plan_roots(v, off, np.random.default_rng(1), strata=strata)
    owner = np.repeat(np.arange(len(v)), roots.m)
    r = (np.random.default_rng(2).random(owner.size) < v[owner]).astype(float)
    args = (roots, v, np.where(r > 0.5, 0.7, 0.3), r, np.ones(owner.size), np.ones(owner.size), int(roots.m.sum()))
    kw = dict(strata=strata, prefix_strata=None if strata is None else fam[owner].tolist(),
              zero_variance_groups=3, zero_variance_trajectories=12)
    base = plan_prefixes(*args, off, np.random.default_rng(3), **kw)
    more = plan_prefixes(*args, on, np.random.default_rng(3), **kw)
    extra = more.second_wave - base.second_wave
    assert extra.sum() == 12 and (extra >= 0).all()
    assert more.k.tolist() == base.k.tolist() and more.budget == base.budget  # B's plan is unchanged
    picked = np.flatnonzero(extra)
    assert not ((roots.m > 0) | (base.second_wave > 0))[picked].any()  # only prompts not yet sampled
    assert (np.abs(v[picked] - 0.5) < 0.1).all()  # the doubtful ones (qa), not the sure ones
    none = plan_prefixes(*args, on, np.random.default_rng(3), **{**kw, "zero_variance_trajectories": 0})
    assert none.second_wave.tolist() == base.second_wave.tolist()
