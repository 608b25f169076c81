"""Comparison plots: effective ratio by iteration per strategy, accuracy against generated tokens."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from trace_core.analysis.learning import mean_ci
from tracking.plots import new_figure, no_data, save_figure


def _lines_by_strategy(ax, frame: pl.DataFrame, x: str, y: str) -> None:
    """Mean of ``x`` and ``y`` over seeds at each iteration, one line per strategy."""
    mean = frame.group_by("strategy", "iteration").agg(pl.col(x).mean(), pl.col(y).mean()).sort("iteration")
    for strat in mean["strategy"].unique().sort():
        sub = mean.filter(pl.col("strategy") == strat)
        ax.plot(sub[x], sub[y], marker="o", label=strat)
    ax.legend(fontsize=7)


def plot_effective_by_iteration(iterations: pl.DataFrame, path: Path) -> Path:
    """Mean effective ratio over seeds, one line per strategy."""
    fig, ax = new_figure()
    if iterations.height:
        _lines_by_strategy(ax, iterations.with_columns(pl.col("iteration").alias("x")), "x", "effective_ratio")
    else:
        no_data(ax, "iterations")
    ax.set(xlabel="iteration", ylabel="effective ratio", ylim=(0, 1), title="Effective ratio by strategy")
    return save_figure(fig, path)


def plot_accuracy_vs_tokens(iterations: pl.DataFrame, path: Path) -> Path:
    """Held-out accuracy at each evaluated iteration against cumulative generated tokens."""
    fig, ax = new_figure()
    rows = iterations.sort("run_id", "iteration").with_columns(pl.col("tokens").cum_sum().over("run_id").alias("cum"))
    rows = rows.filter(pl.col("accuracy").is_not_null())
    if rows.height:
        _lines_by_strategy(ax, rows, "cum", "accuracy")
    else:
        no_data(ax, "evaluations")
    ax.set(xlabel="generated tokens", ylabel="held-out accuracy", title="Accuracy against generated tokens")
    return save_figure(fig, path)


def plot_learning_curves(curves: pl.DataFrame, path: Path, x: str = "tokens", family: str = "all") -> Path:
    """Held-out accuracy against cumulative ``x`` (tokens or seconds), mean over seeds with a 95%
    CI band, one line per strategy; each run's curve is interpolated on a common grid first."""
    import numpy as np


    fig, ax = new_figure()
    sub = curves.filter(pl.col("family") == family)
    if sub.height == 0:
        no_data(ax, "evaluations")
    else:
        top = float(sub.group_by("run_id").agg(pl.col(x).max())[x].min())
        grid = np.linspace(0.0, top, 25)
        for strat in sorted(sub["strategy"].unique().to_list()):
            runs = [g.sort(x) for _, g in sub.filter(pl.col("strategy") == strat).group_by("run_id")]
            ys = np.array([np.interp(grid, g[x].to_numpy(), g["accuracy"].to_numpy()) for g in runs])
            stats = [mean_ci(ys[:, j]) for j in range(len(grid))]
            mean = np.array([s[0] for s in stats])
            half = np.nan_to_num(np.array([s[1] for s in stats]))
            ax.plot(grid, 100 * mean, label=f"{strat} ({len(runs)} seeds)")
            ax.fill_between(grid, 100 * (mean - half), 100 * (mean + half), alpha=0.2)
        ax.legend(fontsize=7)
    label = "generated tokens" if x == "tokens" else "wall-clock seconds (stages 1-7)"
    ax.set(xlabel=label, ylabel=f"held-out accuracy, {family} (%)", title=f"Learning curves ({family}), 95% CI over seeds")
    return save_figure(fig, path)
