"""The hierarchical Beta-Binomial prior: counts, as-of semantics, siblings, empirical Bayes."""

import numpy as np
import polars as pl
import pytest

from trace_core.predictor.config import PriorConfig
from trace_core.predictor.prior import (
    COUNTS_SCHEMA,
    HierarchicalPrior,
    cell_counts,
    outcome_counts,
    sibling_counts,
)
from trace_core.predictor.synthetic import cell_rate_iteration


def _counts(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=list(COUNTS_SCHEMA), orient="row").cast(COUNTS_SCHEMA)


def _query(pid: str | None, task: str = "math", difficulty: int = 1) -> pl.DataFrame:
    return pl.DataFrame({"prompt_id": [pid], "task": [task], "difficulty": [difficulty]},
                        schema={"prompt_id": pl.Utf8, "task": pl.Utf8, "difficulty": pl.Int64})  # fmt: skip


def test_posterior_is_beta_binomial_with_fixed_strengths():
    cfg = PriorConfig(discount=1.0, cell_strength=1e-9, prompt_strength=4.0)
    prior = HierarchicalPrior(cfg)
    # cell math/1: 10 of 20 (so the cell mean is 0.5 whatever the trend); prompt a: 8 of 8
    prior.fit(_counts([("a", "math", 1, 0, 8.0, 8.0), ("b", "math", 1, 0, 2.0, 12.0)]))
    view = prior.posterior(_query("a"), np.array([1]))
    assert view.cell[0] == pytest.approx(0.5, abs=1e-6)
    assert view.prompt[0] == pytest.approx((4 * 0.5 + 8) / (4 + 8))
    assert prior.posterior(_query("unseen"), np.array([1])).prompt[0] == pytest.approx(0.5, abs=1e-6)


def test_only_earlier_iterations_count_and_older_ones_less():
    prior = HierarchicalPrior(PriorConfig(discount=0.5, cell_strength=1e-9, prompt_strength=1e-9))
    prior.fit(_counts([("a", "qa", 0, 0, 0.0, 4.0), ("a", "qa", 0, 1, 4.0, 4.0)]))
    q = _query("a", "qa", 0)
    assert prior.posterior(q, np.array([1])).prompt[0] == pytest.approx(1e-4)  # as of 1: only iteration 0
    # as of 2: iteration 1 counts fully, iteration 0 half -> 4 / (4 + 2)
    assert prior.posterior(q, np.array([2])).prompt[0] == pytest.approx(4 / 6, abs=1e-6)


def test_a_prompts_own_discount_keeps_its_record_while_the_cell_moves():
    """Prompt a failed 4 of 4 at iteration 0; its cell then rose to 12 of 16 at iteration 3. With one
    discount (0.5) a's record has faded by iteration 4 and it is predicted near the cell; with its own
    discount of 1 the record holds it down. The empirical-Bayes grid tries pairs with the prompt's
    discount at least the cell's, and the chosen pair survives a save."""
    rows = [("a", "qa", 0, 0, 0.0, 4.0), ("b", "qa", 0, 3, 12.0, 16.0)]
    fixed = {"discount": 0.5, "cell_strength": 1e-9, "prompt_strength": 1.0}
    one, own = HierarchicalPrior(PriorConfig(**fixed)), HierarchicalPrior(PriorConfig(**fixed, prompt_discount=1.0))
    one.fit(_counts(rows))
    report = own.fit(_counts(rows))
    assert report["discount"] == 0.5 and report["prompt_discount"] == 1.0
    q, t = _query("a", "qa", 0), np.array([4])
    cell = one.posterior(q, t).cell[0]
    assert own.posterior(q, t).cell[0] == pytest.approx(cell)  # the cell is discounted as before
    assert one.posterior(q, t).prompt[0] == pytest.approx((cell + 0) / (1 + 4 * 0.5**3), abs=1e-6)
    assert own.posterior(q, t).prompt[0] == pytest.approx(cell / (1 + 4), abs=1e-6)
    again = HierarchicalPrior.from_state(PriorConfig(), own.state())
    assert again.posterior(q, t).prompt[0] == pytest.approx(own.posterior(q, t).prompt[0])
    grid = HierarchicalPrior(PriorConfig(discount_grid=[0.5, 0.85], prompt_discount_grid=[0.7, 1.0]))
    assert grid._discount_pairs() == [(0.5, 0.7), (0.5, 1.0), (0.85, 1.0)]
    assert HierarchicalPrior(PriorConfig())._discount_pairs() == [(g, None) for g in PriorConfig().discount_grid]


def test_fresh_cells_predict_an_unseen_prompt_from_first_visits():
    """Training on a prompt raises its own rate: first visits 2 of 8 each, revisits 7 of 8 each.
    Pooled, the cell says 0.52 for a prompt never sampled; with fresh_cells it says what first
    visits said (0.25), and a prompt with a record is shrunk toward the revisit cell instead."""
    rows = [(f"p{i}", "qa", 2, 0, 2.0, 8.0) for i in range(4)] + [(f"p{i}", "qa", 2, 1, 7.0, 8.0) for i in range(3)]
    fixed = {"discount": 1.0, "cell_strength": 1e-9, "prompt_strength": 4.0}
    pooled, fresh = HierarchicalPrior(PriorConfig(**fixed)), HierarchicalPrior(PriorConfig(**fixed, fresh_cells=True))
    pooled.fit(_counts(rows))
    fresh.fit(_counts(rows))
    t = np.array([2])
    assert pooled.posterior(_query("new", "qa", 2), t).prompt[0] == pytest.approx(29 / 56, abs=1e-6)
    assert fresh.posterior(_query("new", "qa", 2), t).prompt[0] == pytest.approx(0.25, abs=1e-6)
    seen = fresh.posterior(_query("p3", "qa", 2), t)  # p3: one visit, 2 of 8
    assert seen.cell[0] == pytest.approx(21 / 24, abs=1e-6)
    assert seen.prompt[0] == pytest.approx((4 * 21 / 24 + 2) / 12, abs=1e-6)
    # as of iteration 1 nothing was revisited yet: both cells agree with the pooled one
    assert fresh.posterior(_query("new", "qa", 2), np.array([1])).prompt[0] == pytest.approx(0.25, abs=1e-6)


def test_trend_lends_an_unseen_cell_its_family_slope():
    prior = HierarchicalPrior(PriorConfig(discount=1.0))
    prior.fit(cell_counts(pl.DataFrame({"task": ["fc"] * 3, "difficulty": [0, 1, 2],
                                        "n_success": [19, 12, 4], "n_total": [20, 20, 20]})))  # fmt: skip
    p = prior.posterior(_query(None, "fc", 3), np.array([0])).cell[0]
    assert p < 0.2  # difficulty 3 was never measured: extrapolated down the family's slope
    with pytest.raises(ValueError, match="n_success"):
        cell_counts(pl.DataFrame({"task": ["fc"], "difficulty": [0]}))


def test_empirical_bayes_strength_follows_prompt_heterogeneity():
    """Prompts that are all-or-nothing within a cell -> a weak cell prior on prompts (small k_p);
    prompts that all share the cell rate -> a strong one."""
    rng = np.random.default_rng(0)

    def runs(rates):
        rows = []
        for it in range(4):
            for i, r in enumerate(rates):
                rows.append((f"p{i}", "math", 1, it, float(rng.binomial(8, r)), 8.0))
        return _counts(rows)

    hetero = HierarchicalPrior(PriorConfig(discount=1.0))
    hetero.fit(runs([0.02, 0.98] * 20))
    homo = HierarchicalPrior(PriorConfig(discount=1.0))
    homo.fit(runs([0.5] * 40))
    assert hetero.kappa_prompt < 2.0 and homo.kappa_prompt > 50.0


def test_discount_is_chosen_by_prequential_likelihood():
    """Prompts that switch from failing to succeeding at some iteration: recent outcomes predict, the
    smallest discount wins; prompts with fixed rates: old outcomes count (almost) fully."""
    rng = np.random.default_rng(1)
    switch = rng.integers(1, 6, size=40)
    moving = [(f"p{i}", "qa", 0, it, 8.0 * (it >= c), 8.0) for i, c in enumerate(switch) for it in range(6)]
    rates = rng.uniform(0.2, 0.8, size=40)
    fixed = [(f"p{i}", "qa", 0, it, float(rng.binomial(8, r)), 8.0) for i, r in enumerate(rates) for it in range(6)]
    grid = PriorConfig().discount_grid
    assert HierarchicalPrior(PriorConfig()).fit(_counts(moving))["discount"] == min(grid)
    assert HierarchicalPrior(PriorConfig()).fit(_counts(fixed))["discount"] >= sorted(grid)[-2]


def test_outcome_counts_and_siblings_from_a_tree():
    frame = cell_rate_iteration({("fc", 1): 0.5}, 0, seed=2, n_prompts=2, m=3)
    counts = outcome_counts(frame)
    assert counts.height == 2 and counts["n"].to_list() == [3.0, 3.0]
    s, n = sibling_counts(frame)
    depth = frame["depth"].to_numpy()
    assert np.all(n[depth == 0] == 0) and np.all(n[depth > 0] == 2)  # the two other rollouts
    leaves = frame.filter(pl.col("is_leaf"))
    own = dict(zip(leaves["trajectory_id"], leaves["reward"], strict=True))
    total = dict(zip(counts["prompt_id"], counts["s"], strict=True))
    for i in np.flatnonzero(depth > 0):
        row = frame.row(i, named=True)
        assert s[i] == pytest.approx(total[row["prompt_id"]] - own[row["trajectory_id"]])


def test_state_round_trip():
    prior = HierarchicalPrior(PriorConfig())
    prior.fit(_counts([("a", "math", 1, 0, 3.0, 4.0), ("a", "math", 1, 1, 1.0, 4.0), ("b", "qa", 2, 1, 0.0, 4.0)]))
    again = HierarchicalPrior.from_state(PriorConfig(), prior.state())
    q = pl.concat([_query("a"), _query("b", "qa", 2)])
    np.testing.assert_allclose(again.posterior(q, np.array([2, 2])).prompt, prior.posterior(q, np.array([2, 2])).prompt)
