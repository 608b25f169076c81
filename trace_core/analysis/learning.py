"""Learning curves: held-out accuracy against generated tokens and wall-clock seconds, per strategy.

The outcome of a strategy is the model it trains, so a comparison is read off learning curves:

* ``curve_frame`` joins each run's evaluations (``evaluations`` rows: the held-out accuracy after
  ``iteration`` iterations, 0 = the warm start) to the cumulative tokens and stage seconds of the
  iterations before them (``iterations`` rows): one point per (run, evaluation).
* ``at_budget`` interpolates every run's curve linearly at fixed token checkpoints (fractions of
  the smallest run's total, so every run reaches them: "accuracy at equal tokens").
* ``time_to_accuracy`` finds where a run's curve first reaches a target (the baseline's final
  accuracy: the end of its seed-mean token curve, ``baseline_target``), in tokens and in seconds, interpolated between evaluations;
  ``mean_curve_crossing`` does the same on a strategy's seed-mean token curve (what the table
  reports, with how many single seeds got there), and ``seconds_at_tokens`` turns that crossing into
  the training seconds its runs spent to get there.
* ``learning_table`` reports, per strategy, the accuracy at each checkpoint (mean ± 95% CI over
  seeds, t-interval), the gain over the warm start, the paired difference to the baseline (same
  seed = same prompt stream and held-out set) and the tokens / seconds to the baseline's final.

Pure functions over polars frames (no I/O): ``flows/compare.py`` feeds them the store's rows.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from scipy import stats

CHECKPOINTS = (0.25, 0.5, 0.75, 1.0)  # token checkpoints as fractions of the smallest run's total


def _stage_seconds(iterations: pl.DataFrame) -> pl.Series:
    """Seconds of the seven stages per iteration row (evaluation excluded: it measures, it does not train)."""
    return pl.Series("seconds", [sum(json.loads(t or "{}").values()) for t in iterations["timings"].to_list()],
                     dtype=pl.Float64)


def curve_frame(iterations: pl.DataFrame, evaluations: pl.DataFrame) -> pl.DataFrame:
    """One row per (run, evaluation, family): run_id, strategy, seed_index, iteration (iterations
    trained), family, accuracy, tokens and seconds (cumulative, of the iterations before it)."""
    it = iterations.sort("run_id", "iteration").with_columns(_stage_seconds(iterations.sort("run_id", "iteration")))
    cum = it.select(
        "run_id", (pl.col("iteration") + 1).alias("iteration"),
        pl.col("tokens").cum_sum().over("run_id").cast(pl.Float64).alias("tokens"),
        pl.col("seconds").cum_sum().over("run_id").alias("seconds"))
    start = cum.select("run_id").unique().with_columns(pl.lit(0, dtype=cum["iteration"].dtype).alias("iteration"),
                                                       pl.lit(0.0).alias("tokens"), pl.lit(0.0).alias("seconds"))
    cum = pl.concat([start, cum], how="vertical_relaxed")
    ev = evaluations.filter(pl.col("split") == "heldout").with_columns(pl.col("iteration").cast(cum["iteration"].dtype))
    # the store's evaluation rows carry their own duration and may carry tokens: the curve's axes are
    # the training's, never the evaluation's
    ev = ev.drop([c for c in ("tokens", "seconds") if c in ev.columns])
    out = ev.join(cum, on=["run_id", "iteration"], how="inner")
    return out.select("run_id", "strategy", "iteration", "family", "accuracy", "episodes", "tokens", "seconds"
                      ).sort("run_id", "family", "iteration")


def _interp(x: np.ndarray, y: np.ndarray, at: float) -> float:
    return float(np.interp(at, x, y)) if len(x) else float("nan")


def at_budget(curves: pl.DataFrame, fractions: tuple[float, ...] = CHECKPOINTS, family: str = "all") -> pl.DataFrame:
    """Accuracy of every run at fixed token checkpoints: run_id, strategy, checkpoint, tokens, accuracy."""
    sub = curves.filter(pl.col("family") == family)
    if sub.height == 0:
        return pl.DataFrame(schema={"run_id": pl.Utf8, "strategy": pl.Utf8, "checkpoint": pl.Float64,
                                    "tokens": pl.Float64, "accuracy": pl.Float64})
    total = float(sub.group_by("run_id").agg(pl.col("tokens").max())["tokens"].min())
    rows = []
    for (run_id, strat), g in sub.group_by("run_id", "strategy", maintain_order=True):
        g = g.sort("tokens")
        for f in fractions:
            rows.append({"run_id": run_id, "strategy": strat, "checkpoint": f, "tokens": f * total,
                         "accuracy": _interp(g["tokens"].to_numpy(), g["accuracy"].to_numpy(), f * total)})
    return pl.DataFrame(rows)


def _first_crossing(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """Smallest x where the piecewise-linear curve (x, y) reaches ``target`` (NaN if it never does)."""
    if len(x) == 0:
        return float("nan")
    if y[0] >= target:
        return float(x[0])
    for i in range(1, len(x)):
        if y[i] >= target:
            return float(x[i - 1] + (target - y[i - 1]) / (y[i] - y[i - 1]) * (x[i] - x[i - 1]))
    return float("nan")


def time_to_accuracy(curves: pl.DataFrame, target: float, family: str = "all") -> pl.DataFrame:
    """Per run: the tokens and seconds at which its held-out accuracy first reaches ``target``."""
    rows = []
    for (run_id, strat), g in curves.filter(pl.col("family") == family).group_by("run_id", "strategy",
                                                                                   maintain_order=True):
        g = g.sort("iteration")
        acc = g["accuracy"].to_numpy()
        rows.append({"run_id": run_id, "strategy": strat,
                     "tokens_to_target": _first_crossing(g["tokens"].to_numpy(), acc, target),
                     "seconds_to_target": _first_crossing(g["seconds"].to_numpy(), acc, target)})
    return pl.DataFrame(rows, schema={"run_id": pl.Utf8, "strategy": pl.Utf8, "tokens_to_target": pl.Float64,
                                      "seconds_to_target": pl.Float64})


def _mean_curve(curves: pl.DataFrame, strategy: str, x: str = "tokens", family: str = "all",
                points: int = 200) -> tuple[np.ndarray, np.ndarray] | None:
    """The seed-mean curve of ``strategy``: each run interpolated on a common grid of ``x`` up to
    the smallest run's end (None without runs)."""
    sub = curves.filter((pl.col("family") == family) & (pl.col("strategy") == strategy))
    if sub.height == 0:
        return None
    runs = [g.sort(x) for _, g in sub.group_by("run_id")]
    grid = np.linspace(0.0, min(float(g[x].max()) for g in runs), points)
    return grid, np.mean([np.interp(grid, g[x].to_numpy(), g["accuracy"].to_numpy()) for g in runs], axis=0)


def mean_curve_crossing(curves: pl.DataFrame, strategy: str, target: float, x: str = "tokens",
                        family: str = "all", points: int = 200) -> float:
    """Where the seed-mean curve of ``strategy`` first reaches ``target``; NaN if it never does."""
    curve = _mean_curve(curves, strategy, x, family, points)
    if curve is None or not np.isfinite(target):
        return float("nan")
    return _first_crossing(*curve, target - 1e-9)


def seconds_at_tokens(curves: pl.DataFrame, strategy: str, tokens: float, family: str = "all") -> float:
    """The training seconds ``strategy``'s runs spent to generate ``tokens`` (mean over its seeds,
    each interpolated between evaluations): where its seed-mean token curve reaches a target, in
    seconds. (A crossing of a seed-mean *seconds* curve would not do: runs slowed by a shared
    machine end at different seconds, and that curve stops at the fastest run's end.)"""
    sub = curves.filter((pl.col("family") == family) & (pl.col("strategy") == strategy))
    if sub.height == 0 or not np.isfinite(tokens):
        return float("nan")
    runs = [g.sort("tokens") for _, g in sub.group_by("run_id")]
    return float(np.mean([np.interp(tokens, g["tokens"].to_numpy(), g["seconds"].to_numpy()) for g in runs]))


def baseline_target(curves: pl.DataFrame, baseline: str = "grpo") -> float:
    """The accuracy time-to-accuracy aims at: the end of the baseline's seed-mean token curve (its
    seeds' accuracy at the tokens every one of them reached). Its runs' mean final accuracy would
    not do: where their token totals differ, the mean curve stops at the smallest one and can end
    below it, and the baseline would never reach its own target."""
    curve = _mean_curve(curves, baseline)
    return float(curve[1][-1]) if curve is not None else float("nan")


def mean_ci(values) -> tuple[float, float]:
    """Mean and 95% t-interval half-width (NaN half-width with fewer than 2 finite values)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    if len(v) < 2:
        return float(v.mean()), float("nan")
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def _seed_of(run_id: str) -> str:
    """Compare children are ``<id>-<strategy>-s<seed>``: the seed pairs runs across strategies."""
    return run_id.rsplit("-s", 1)[-1]


def learning_table(curves: pl.DataFrame, baseline: str = "grpo", order: list[str] | None = None,
                   fractions: tuple[float, ...] = CHECKPOINTS) -> tuple[pl.DataFrame, dict]:
    """Per strategy: accuracy at each token checkpoint (mean, CI), its gain over the warm start,
    the paired difference to ``baseline`` at the last checkpoint, tokens / seconds to reach the
    baseline's final accuracy and their ratio to the baseline's. Returns (table, context)."""
    pts = at_budget(curves, fractions)
    start = curves.filter((pl.col("family") == "all") & (pl.col("iteration") == 0))
    start_by_run = dict(zip(start["run_id"].to_list(), start["accuracy"].to_list(), strict=True))
    finals = curves.filter(pl.col("family") == "all").sort("iteration").group_by("run_id", "strategy").last()
    target = baseline_target(curves, baseline)
    start_mean = float(np.mean(list(start_by_run.values()))) if start_by_run else float("nan")
    degenerate = np.isfinite(target) and np.isfinite(start_mean) and target <= start_mean
    # a baseline that ended at or below the warm start sets no target to reach
    tta = time_to_accuracy(curves, target) if np.isfinite(target) and not degenerate else None
    last = max(fractions)
    base_last = {_seed_of(r["run_id"]): r["accuracy"] for r in
                 pts.filter((pl.col("strategy") == baseline) & (pl.col("checkpoint") == last)).iter_rows(named=True)}
    rows = []
    for strat in order or sorted(pts["strategy"].unique().to_list()):
        sp = pts.filter(pl.col("strategy") == strat)
        if sp.height == 0:
            continue
        row: dict = {"strategy": strat, "seeds": sp["run_id"].n_unique()}
        for f in fractions:
            row[f"acc@{f:g}"], row[f"acc@{f:g}_ci"] = mean_ci(sp.filter(pl.col("checkpoint") == f)["accuracy"])
        lastpts = sp.filter(pl.col("checkpoint") == last)
        gains = [r["accuracy"] - start_by_run.get(r["run_id"], np.nan) for r in lastpts.iter_rows(named=True)]
        row["gain"], row["gain_ci"] = mean_ci(gains)
        diffs = [r["accuracy"] - base_last[s] for r in lastpts.iter_rows(named=True)
                 if (s := _seed_of(r["run_id"])) in base_last]
        row["vs_baseline"], row["vs_baseline_ci"] = mean_ci(diffs) if strat != baseline else (0.0, float("nan"))
        fin = finals.filter(pl.col("strategy") == strat)
        row["final"], row["final_ci"] = mean_ci(fin["accuracy"])
        row["tokens_total"] = float(curves.filter((pl.col("strategy") == strat) & (pl.col("family") == "all"))
                                    .group_by("run_id").agg(pl.col("tokens").max())["tokens"].mean())
        if tta is not None:
            st = tta.filter(pl.col("strategy") == strat)
            reached = st["tokens_to_target"].is_not_nan().sum()
            row["reached"] = f"{reached}/{st.height}"
            row["tokens_to_target"] = mean_curve_crossing(curves, strat, target, "tokens")
            row["seconds_to_target"] = seconds_at_tokens(curves, strat, row["tokens_to_target"])
            bt = mean_curve_crossing(curves, baseline, target, "tokens")
            bs = seconds_at_tokens(curves, baseline, bt)
            row["tokens_ratio"] = row["tokens_to_target"] / bt if bt and np.isfinite(bt) else float("nan")
            row["seconds_ratio"] = row["seconds_to_target"] / bs if bs and np.isfinite(bs) else float("nan")
        rows.append(row)
    total = float(curves.filter(pl.col("family") == "all").group_by("run_id").agg(pl.col("tokens").max())["tokens"].min()
                  ) if curves.height else float("nan")
    episodes = curves.filter(pl.col("family") == "all")["episodes"]
    context = {"baseline": baseline, "target": target, "start": start_mean, "target_defined": tta is not None,
               "checkpoint_tokens": [f * total for f in fractions],
               "episodes": int(episodes.max()) if episodes.len() else 0}
    return pl.DataFrame(rows), context


def _pct(v, ci=None) -> str:
    if v is None or not np.isfinite(v):
        return "–"
    s = f"{100 * v:.1f}"
    return s + (f" ± {100 * ci:.1f}" if ci is not None and np.isfinite(ci) else "")


def _num(v, fmt: str = "{:.0f}", missing: str = "not reached") -> str:
    return fmt.format(v) if v is not None and np.isfinite(v) else missing


def learning_markdown(table: pl.DataFrame, context: dict, fractions: tuple[float, ...] = CHECKPOINTS) -> str:
    """The learning table as markdown (accuracy in points, ± = 95% CI over seeds)."""
    toks = context["checkpoint_tokens"]
    heads = [f"acc @ {t / 1000:.3g}k tok" for t in toks]
    lines = [f"Held-out accuracy (%, {context['episodes']} episodes per evaluation) at equal generated tokens; "
             f"± = 95% CI over seeds. Target for time-to-accuracy: {context['baseline']}'s final accuracy "
             f"(its seed mean at the tokens all its seeds reached) {_pct(context['target'])}%"
             + ("." if context.get("target_defined", True) else
                f", not above the warm start's {_pct(context['start'])}%: time-to-accuracy is undefined."), "",
             "| strategy | seeds | " + " | ".join(heads) + " | gain vs start | vs " + context["baseline"]
             + " (paired) | tokens to target | × | seconds to target | × |",
             "|" + "---|" * (len(heads) + 8)]
    miss = "not reached" if context.get("target_defined", True) else "–"
    for r in table.iter_rows(named=True):
        cells = [_pct(r[f"acc@{f:g}"], r[f"acc@{f:g}_ci"]) for f in fractions]
        lines.append(f"| {r['strategy']} | {r['seeds']} | " + " | ".join(cells)
                     + f" | {_pct(r['gain'], r['gain_ci'])} | {_pct(r['vs_baseline'], r['vs_baseline_ci'])}"
                     + f" | {_num(r.get('tokens_to_target'), missing=miss)} | {_num(r.get('tokens_ratio'), '{:.2f}', '–')}"
                     + f" | {_num(r.get('seconds_to_target'), missing=miss)} | {_num(r.get('seconds_ratio'), '{:.2f}', '–')} |")
    return "\n".join(lines)
