"""Oracle simulator: martingale, calibration of the default mix, a small end-to-end run."""

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError

from trace_core.analysis.simulate import SimulateConfig, format_table, run_simulation, sample_difficulty, walk
from trace_core.utility import root_utility


def test_walk_is_a_bounded_martingale_that_spreads():
    rng = np.random.default_rng(0)
    p = np.full(200_000, 0.3)
    paths = walk(p, np.full(p.size, 6), 0.6, rng)
    assert paths.min() >= 0.0 and paths.max() <= 1.0
    assert paths[:, -1].mean() == pytest.approx(0.3, abs=0.005)  # martingale
    spread = (paths * (1 - paths)).mean(axis=0)  # E[p(1-p)] falls: drift toward 0 / 1
    assert np.all(np.diff(spread) < 0)
    short = walk(np.array([0.5, 0.5]), np.array([0, 3]), 0.6, rng)
    assert short[0].tolist() == [0.5] * 4  # a row stops after its own steps


def test_default_mix_gives_grpo_about_27_percent():
    p = sample_difficulty(SimulateConfig(), 400_000, np.random.default_rng(1))
    assert root_utility(p, 8).mean() == pytest.approx(0.27, abs=0.01)


def test_small_run_table_and_findings():
    cfg = SimulateConfig(iterations=2, seeds=3, allocation={"budget_total": 256})
    df = run_simulation(cfg)
    assert isinstance(df, pl.DataFrame)
    assert df.height == 9 and {"effective_ratio", "effective_ratio_ci", "grad_energy"} <= set(df.columns)
    spent = dict(zip(df["strategy"], df["trajectories"], strict=True))
    assert all(np.isclose(v, 256) for k, v in spent.items() if k != "dapo")  # equal budget, fully spent
    assert spent["dapo"] > 256  # dynamic sampling refills its zero-variance groups, paid on top
    eff = dict(zip(df["strategy"], df["effective_ratio"], strict=True))
    assert eff["trace"] > eff["grpo"] + 0.2
    assert eff["trace"] > max(eff["trace-root"], eff["trace-prefix"])
    assert min(eff["trace-root"], eff["trace-prefix"]) > eff["treepo"]
    text = format_table(df)
    assert "trace-prefix" in text and "±" in text
    again = run_simulation(cfg)
    assert again.equals(df)  # seeded


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="unknown strategies"):
        SimulateConfig(strategies=["grpo", "nope"])
    with pytest.raises(ValidationError, match="turns"):
        SimulateConfig(turns=1)
    with pytest.raises(ValidationError, match="extra"):
        SimulateConfig(bogus=1)


def test_trajectory_root_objective_spends_the_budget_on_fewer_full_groups():
    def run(objective):
        cfg = SimulateConfig(iterations=2, seeds=3, strategies=["trace"], coverage_rows=False,
                             allocation={"budget_total": 256, "trace": {"root_share": 0.5, "root_objective": objective}})
        return run_simulation(cfg).row(0, named=True)

    groups, trajectories = run("groups"), run("trajectories")
    assert groups["trajectories"] == trajectories["trajectories"] == 256  # equal budget, fully spent
    assert trajectories["prompts"] == 128 / 8 < groups["prompts"]  # m in {0, M}: full groups only
    assert trajectories["effective_ratio"] > groups["effective_ratio"]
