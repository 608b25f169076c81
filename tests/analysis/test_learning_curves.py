"""Learning curves: interpolation at equal tokens, time-to-accuracy, CIs over seeds, paired differences."""

import json
import math

import numpy as np
import polars as pl
import pytest

from trace_core.analysis.learning import (
    at_budget,
    curve_frame,
    learning_markdown,
    learning_table,
    mean_ci,
    time_to_accuracy,
)


def _rows(run_id: str, strategy: str, tokens: list[int], secs: list[float], acc: list[float]):
    """iterations rows (one per iteration) and evaluations rows (after 0, 1, ... iterations)."""
    its = [{"run_id": run_id, "strategy": strategy, "iteration": i, "tokens": t,
            "timings": json.dumps({"generate_raw_rollouts": s})} for i, (t, s) in enumerate(zip(tokens, secs, strict=True))]
    evs = [{"run_id": run_id, "strategy": strategy, "iteration": i, "split": "heldout", "family": "all",
            "accuracy": a, "episodes": 1000} for i, a in enumerate(acc)]
    return its, evs


def _frames(spec):
    its, evs = [], []
    for args in spec:
        a, b = _rows(*args)
        its += a
        evs += b
    return pl.DataFrame(its), pl.DataFrame(evs)


def test_curve_frame_accumulates_tokens_and_seconds_before_each_evaluation():
    its, evs = _frames([("c-grpo-s0", "grpo", [100, 100], [1.0, 2.0], [0.40, 0.45, 0.50])])
    cur = curve_frame(its, evs)
    assert cur["iteration"].to_list() == [0, 1, 2]
    assert cur["tokens"].to_list() == [0.0, 100.0, 200.0]
    assert cur["seconds"].to_list() == [0.0, 1.0, 3.0]
    # the store's evaluation rows carry the evaluation's own duration: the axis stays the training's
    cur = curve_frame(its, evs.with_columns(pl.lit(40.0).alias("seconds")))
    assert cur["seconds"].to_list() == [0.0, 1.0, 3.0]


def test_interpolation_at_equal_tokens_and_time_to_accuracy():
    # grpo: 0.40 -> 0.50 over 400 tokens; trace: 0.40 -> 0.60 over 200 tokens (then flat)
    its, evs = _frames([("c-grpo-s0", "grpo", [200, 200], [2.0, 2.0], [0.40, 0.45, 0.50]),
                        ("c-trace-s0", "trace", [100, 100], [1.0, 1.0], [0.40, 0.50, 0.60])])
    cur = curve_frame(its, evs)
    pts = at_budget(cur, (0.5, 1.0))  # the smallest run's total is 200 tokens
    got = {(r["strategy"], r["checkpoint"]): r["accuracy"] for r in pts.iter_rows(named=True)}
    assert got[("grpo", 1.0)] == pytest.approx(0.45) and got[("trace", 1.0)] == pytest.approx(0.60)
    assert got[("grpo", 0.5)] == pytest.approx(0.425) and got[("trace", 0.5)] == pytest.approx(0.50)
    tta = {r["strategy"]: r for r in time_to_accuracy(cur, 0.50).iter_rows(named=True)}
    assert tta["grpo"]["tokens_to_target"] == pytest.approx(400.0)
    assert tta["trace"]["tokens_to_target"] == pytest.approx(100.0)
    assert tta["trace"]["seconds_to_target"] == pytest.approx(1.0)
    assert math.isnan(time_to_accuracy(cur, 0.99)["tokens_to_target"][0])


def test_learning_table_pairs_seeds_and_reports_ratios():
    spec = []
    for s, (g_end, t_end) in enumerate([(0.50, 0.56), (0.48, 0.55), (0.52, 0.57)]):
        spec.append((f"c-grpo-s{s}", "grpo", [100, 100], [1.0, 1.0], [0.40, (0.40 + g_end) / 2, g_end]))
        spec.append((f"c-trace-s{s}", "trace", [100, 100], [1.0, 1.0], [0.40, (0.40 + t_end) / 2, t_end]))
    table, ctx = learning_table(curve_frame(*_frames(spec)), order=["grpo", "trace"])
    rows = {r["strategy"]: r for r in table.iter_rows(named=True)}
    assert ctx["target"] == pytest.approx(0.50)
    assert rows["trace"]["vs_baseline"] == pytest.approx(np.mean([0.06, 0.07, 0.05]))
    assert rows["trace"]["vs_baseline_ci"] > 0
    assert rows["grpo"]["gain"] == pytest.approx(0.10)
    assert rows["grpo"]["tokens_ratio"] == pytest.approx(1.0) and rows["trace"]["tokens_ratio"] < 0.75
    assert rows["grpo"]["reached"] == "2/3" and rows["trace"]["reached"] == "3/3"
    md = learning_markdown(table, ctx)
    assert "| trace | 3 |" in md and "tokens to target" in md


def test_mean_ci_matches_the_t_interval():
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert math.isnan(mean_ci([1.0])[1])


def test_no_time_to_accuracy_when_the_baseline_did_not_improve():
    its, evs = _frames([("c-grpo-s0", "grpo", [100, 100], [1.0, 1.0], [0.50, 0.48, 0.47]),
                        ("c-trace-s0", "trace", [100, 100], [1.0, 1.0], [0.50, 0.52, 0.53])])
    table, ctx = learning_table(curve_frame(its, evs), order=["grpo", "trace"])
    assert not ctx["target_defined"]
    assert "tokens_to_target" not in table.columns
    assert "time-to-accuracy is undefined" in learning_markdown(table, ctx)


def test_the_baseline_reaches_its_own_target_when_its_seeds_spend_different_tokens():
    # seed 1 spends more tokens and falls at its end: the mean of finals (0.51) lies above the
    # seed-mean curve's end on the common grid, which the baseline would then never reach
    its, evs = _frames([("c-grpo-s0", "grpo", [100, 100], [1.0, 1.0], [0.40, 0.45, 0.50]),
                        ("c-grpo-s1", "grpo", [100, 150], [1.0, 1.0], [0.40, 0.50, 0.52]),
                        ("c-trace-s0", "trace", [100, 100], [1.0, 1.0], [0.40, 0.50, 0.55]),
                        ("c-trace-s1", "trace", [100, 100], [1.0, 1.0], [0.40, 0.50, 0.55])])
    table, ctx = learning_table(curve_frame(its, evs), order=["grpo", "trace"])
    rows = {r["strategy"]: r for r in table.iter_rows(named=True)}
    assert ctx["target"] == pytest.approx((0.50 + 0.50 + 0.02 * 100 / 150) / 2)  # both at 200 tokens
    assert rows["grpo"]["tokens_ratio"] == pytest.approx(1.0)
    assert rows["trace"]["tokens_to_target"] < rows["grpo"]["tokens_to_target"]


def test_seconds_to_target_are_the_seconds_spent_to_the_token_crossing():
    # grpo s1 ran on a slower machine: the seconds its runs spent differ, the tokens do not
    its, evs = _frames([("c-grpo-s0", "grpo", [100, 100], [1.0, 1.0], [0.40, 0.45, 0.50]),
                        ("c-grpo-s1", "grpo", [100, 100], [3.0, 3.0], [0.40, 0.45, 0.50]),
                        ("c-trace-s0", "trace", [100, 100], [1.0, 1.0], [0.40, 0.50, 0.55]),
                        ("c-trace-s1", "trace", [100, 100], [1.0, 1.0], [0.40, 0.50, 0.55])])
    table, _ = learning_table(curve_frame(its, evs), order=["grpo", "trace"])
    rows = {r["strategy"]: r for r in table.iter_rows(named=True)}
    assert rows["grpo"]["seconds_to_target"] == pytest.approx(4.0, rel=0.02)  # (2 + 6) / 2 at 200 tokens
    assert rows["grpo"]["seconds_ratio"] == pytest.approx(1.0)
    assert rows["trace"]["seconds_to_target"] == pytest.approx(1.0, rel=0.02)  # 100 tokens in 1 s
