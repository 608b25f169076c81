"""Comparison plots: effective ratio by iteration per strategy, accuracy against generated tokens."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracking.plots import _figure, _no_data, _save


def plot_effective_by_iteration(iterations: pl.DataFrame, path: Path) -> Path:
    """Mean effective ratio over seeds, one line per strategy."""
    fig, ax = _figure()
    if iterations.height:
        mean = iterations.group_by("strategy", "iteration").agg(pl.col("effective_ratio").mean()).sort("iteration")
        for strat in mean["strategy"].unique(maintain_order=True).sort():
            sub = mean.filter(pl.col("strategy") == strat)
            ax.plot(sub["iteration"], sub["effective_ratio"], marker="o", label=strat)
        ax.legend(fontsize=7)
    else:
        _no_data(ax, "iterations")
    ax.set(xlabel="iteration", ylabel="effective ratio", ylim=(0, 1), title="Effective ratio by strategy")
    return _save(fig, path)


def plot_accuracy_vs_tokens(iterations: pl.DataFrame, path: Path) -> Path:
    """Held-out accuracy at each evaluated iteration against cumulative generated tokens."""
    fig, ax = _figure()
    rows = iterations.sort("run_id", "iteration").with_columns(pl.col("tokens").cum_sum().over("run_id").alias("cum"))
    rows = rows.filter(pl.col("accuracy").is_not_null())
    if rows.height:
        mean = rows.group_by("strategy", "iteration").agg(pl.col("cum").mean(), pl.col("accuracy").mean()).sort("iteration")
        for strat in mean["strategy"].unique(maintain_order=True).sort():
            sub = mean.filter(pl.col("strategy") == strat)
            ax.plot(sub["cum"], sub["accuracy"], marker="o", label=strat)
        ax.legend(fontsize=7)
    else:
        _no_data(ax, "evaluations")
    ax.set(xlabel="generated tokens", ylabel="held-out accuracy", title="Accuracy against generated tokens")
    return _save(fig, path)
