"""PNG plots of a run, drawn from the node store's named queries (matplotlib, Agg canvas).

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot global state), so they
can be drawn from any thread and never need a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from trace_core.home.queries import run_named_query

ACCURACY_COLUMNS = ("accuracy", "accuracy_math", "accuracy_qa", "accuracy_fc")


def new_figure() -> tuple[Figure, object]:
    fig = Figure(figsize=(6.0, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def save_figure(fig: Figure, path: Path | BinaryIO) -> Path | BinaryIO:
    """PNG to a file (its directory created) or a binary buffer; no metadata text chunks."""
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes)


def plot_effective_ratio(by_iteration: pl.DataFrame, path: Path) -> Path:
    """``by_iteration``: columns iteration, effective_ratio[, wasted_share] (one row each)."""
    fig, ax = new_figure()
    if by_iteration.height:
        ax.plot(by_iteration["iteration"], by_iteration["effective_ratio"], marker="o", label="effective ratio")
        if "wasted_share" in by_iteration.columns:
            ax.plot(by_iteration["iteration"], by_iteration["wasted_share"], marker="x", ls="--", label="wasted share")
        ax.legend()
    else:
        no_data(ax, "iterations")
    ax.set(xlabel="iteration", ylabel="share of trajectories", ylim=(0, 1), title="Effective ratio")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_figure(fig, path)


def plot_accuracy(iterations: pl.DataFrame, path: Path) -> Path:
    """``iterations``: column iteration plus any of accuracy, accuracy_{math,qa,fc}."""
    fig, ax = new_figure()
    drawn = 0
    for col in ACCURACY_COLUMNS:
        if col in iterations.columns and iterations[col].drop_nulls().len():
            rows = iterations.filter(pl.col(col).is_not_null())
            ax.plot(rows["iteration"], rows[col], marker="o", label=col.removeprefix("accuracy_"))
            drawn += 1
    if drawn:
        ax.legend()
    else:
        no_data(ax, "accuracy")
    ax.set(xlabel="iteration", ylabel="held-out accuracy", ylim=(0, 1), title="Accuracy")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_figure(fig, path)


def plot_allocation_histogram(hist: pl.DataFrame, path: Path) -> Path:
    """``hist``: columns m_alloc, prompts (prompts per allocated rollout count)."""
    fig, ax = new_figure()
    if hist.height:
        agg = hist.group_by("m_alloc").agg(pl.col("prompts").sum()).sort("m_alloc")
        ax.bar(agg["m_alloc"], agg["prompts"])
    else:
        no_data(ax, "allocations")
    ax.set(xlabel="rollouts allocated (m, 0 = skipped)", ylabel="prompts", title="Root allocation")
    return save_figure(fig, path)


def plot_calibration(bins: pl.DataFrame, path: Path) -> Path:
    """``bins``: columns kind, mean_pred, mean_outcome (output of predictor_calibration_bins)."""
    fig, ax = new_figure()
    ax.plot([0, 1], [0, 1], color="grey", ls=":", label="perfect")
    for kind in sorted(bins["kind"].unique().to_list()) if bins.height else []:
        rows = bins.filter(pl.col("kind") == kind).sort("mean_pred")
        ax.plot(rows["mean_pred"], rows["mean_outcome"], marker="o", label=kind)
    if not bins.height:
        no_data(ax, "predictions")
    ax.legend()
    ax.set(xlabel="predicted success", ylabel="observed success", xlim=(0, 1), ylim=(0, 1),
           title="Predictor calibration")
    return save_figure(fig, path)


def plot_waste(frame: pl.DataFrame, by: str, path: Path | BinaryIO, *, title: str, xlabel: str) -> Path | BinaryIO:
    """Trajectories generated and wasted per value of ``by`` (a named wasted_by_* query's rows:
    columns ``by``, trajectories, wasted; rows with the same ``by`` are summed)."""
    fig, ax = new_figure()
    if frame.height:
        agg = frame.group_by(by).agg(pl.col("trajectories").sum(), pl.col("wasted").sum()).sort(by)
        labels = [str(v) for v in agg[by]]
        ax.bar(labels, agg["trajectories"], color="#9ecae1", label="generated")
        ax.bar(labels, agg["wasted"], color="#de2d26", label="wasted")
        for x, (t, w) in enumerate(zip(agg["trajectories"], agg["wasted"], strict=True)):
            ax.text(x, t, f"{w / t:.0%}" if t else "", ha="center", va="bottom", fontsize=8)
        ax.legend()
    else:
        no_data(ax, "trajectories")
    ax.set(xlabel=xlabel, ylabel="trajectories", title=title)
    return save_figure(fig, path)


def write_run_plots(home_dir: str | Path, run_id: str, out_dir: str | Path) -> list[Path]:
    """The four standard plots of a run, as PNG files in ``out_dir``."""
    out = Path(out_dir)
    iterations = run_named_query(home_dir, "iteration_summary", run_id=run_id)
    by_iteration = iterations.select("iteration", "effective_ratio", "wasted_share")
    if not by_iteration.height or by_iteration["effective_ratio"].null_count() == by_iteration.height:
        # the flow wrote no summary rows: derive the ratio from the nodes themselves
        by_iteration = run_named_query(home_dir, "wasted_by_iteration", run_id=run_id)
    return [
        plot_effective_ratio(by_iteration, out / "effective_ratio.png"),
        plot_accuracy(iterations, out / "accuracy.png"),
        plot_allocation_histogram(run_named_query(home_dir, "allocation_histogram", run_id=run_id),
                                  out / "allocation_histogram.png"),
        plot_calibration(run_named_query(home_dir, "predictor_calibration_bins", run_id=run_id),
                         out / "calibration.png"),
    ]
