"""Strategies side by side: the comparison table (means with 95% CIs over seeds) from the
``iterations`` rows of each child run, and its markdown."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from scipy import stats

METRICS = ("effective_ratio", "wasted_share", "effective_per_1k_tokens", "final_accuracy",
           "final_accuracy_math", "final_accuracy_qa", "final_accuracy_fc", "tokens", "seconds")


def per_run(iterations: pl.DataFrame) -> pl.DataFrame:
    """One row per child run: pooled effective ratio over its iterations, tokens, accuracy after
    the last iteration, wall time."""
    if "seconds" not in iterations.columns:  # stage timings are stored as a JSON object per row
        secs = [sum(json.loads(t or "{}").values()) for t in iterations["timings"].to_list()]
        iterations = iterations.with_columns(pl.Series("seconds", secs, dtype=pl.Float64))
    last = iterations.sort("iteration").group_by("run_id").last()
    agg = iterations.group_by("run_id", "strategy").agg(
        (pl.col("effective_ratio") * pl.col("budget_used")).sum().alias("_eff"),
        pl.col("budget_used").sum().alias("trajectories"), pl.col("tokens").sum().alias("tokens"),
        pl.col("seconds").sum().alias("seconds"))
    out = agg.join(last.select("run_id", *[pl.col(c).alias(f"final_{c}") for c in
                                           ("accuracy", "accuracy_math", "accuracy_qa", "accuracy_fc")]),
                   on="run_id", how="left")
    return out.with_columns(
        (pl.col("_eff") / pl.col("trajectories")).alias("effective_ratio"),
        (1 - pl.col("_eff") / pl.col("trajectories")).alias("wasted_share"),
        (1000 * pl.col("_eff") / pl.col("tokens")).alias("effective_per_1k_tokens"),
    ).drop("_eff")


def _ci(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    if len(values) < 2:
        return float("nan")
    return float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))


def comparison_table(iterations: pl.DataFrame, order: list[str] | None = None) -> pl.DataFrame:
    """Mean and 95% CI half-width over seeds, per strategy, for every metric in ``METRICS``."""
    runs = per_run(iterations)
    rows = []
    for strat in order or sorted(runs["strategy"].unique()):
        sub = runs.filter(pl.col("strategy") == strat)
        if sub.height == 0:
            continue
        row = {"strategy": strat, "seeds": sub.height}
        for m in METRICS:
            vals = sub[m].cast(pl.Float64).fill_null(np.nan).to_numpy() if m in sub.columns else np.array([np.nan])
            row[m] = float(np.nanmean(vals)) if np.isfinite(vals).any() else None
            row[f"{m}_ci"] = _ci(vals)
        rows.append(row)
    return pl.DataFrame(rows)


def _num(v: float) -> str:
    """One style for counts and rates: whole numbers with thousands separators from 100 up
    (``2,040``), two decimals below (``3.91``); never scientific notation."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def _fmt(v, ci, pct: bool) -> str:
    if v is None:
        return "–"
    s = f"{100 * v:.1f}%" if pct else _num(v)
    if ci == ci and ci is not None:  # not NaN
        s += f" ± {100 * ci:.1f}" if pct else f" ± {_num(ci)}"
    return s


def comparison_markdown(table: pl.DataFrame) -> str:
    cols = [("effective ratio", "effective_ratio", True), ("wasted", "wasted_share", True),
            ("eff./1k tok", "effective_per_1k_tokens", False), ("acc (all)", "final_accuracy", True),
            ("acc math", "final_accuracy_math", True), ("acc qa", "final_accuracy_qa", True),
            ("acc fc", "final_accuracy_fc", True), ("tokens", "tokens", False), ("wall s", "seconds", False)]
    head = "| strategy | seeds | " + " | ".join(c[0] for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for r in table.iter_rows(named=True):
        cells = [_fmt(r[k], r[f"{k}_ci"], pct) for _, k, pct in cols]
        lines.append(f"| {r['strategy']} | {r['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
