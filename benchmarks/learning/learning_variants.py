"""Several runs of one strategy side by side at the same absolute token checkpoints: each
``LABEL=HOME:PREFIX`` names the runs (of any home) whose id starts with PREFIX (``+`` joins more
``HOME:PREFIX`` to one label: seeds run as separate comparisons); every variant is paired with the
first (the baseline) by run seed:

    PYTHONPATH=. python benchmarks/learning/learning_variants.py grpo=/tmp/lb:lb-grpo \\
        trace=/tmp/lb:lb-trace "trace stratified=/tmp/lbs:lbs-trace" --tokens 49000,99000,148000,198000

Prints one markdown row per variant: seeds, held-out accuracy at each checkpoint (mean ± 95% CI over
seeds; a run that ended before a checkpoint is left out there), the paired difference to the
baseline at the last checkpoint, the final accuracy and gain, tokens, effective ratio, the
per-family accuracy at the end, and time-to-accuracy: the tokens and training seconds at which the
variant's seed-mean token curve first reaches the baseline's final accuracy (the end of the
baseline's seed-mean curve, ``trace_core.analysis.learning.baseline_target``), with their ratio to the
baseline's own (seconds are the stages' own, so they compare only runs made at the same load).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.analysis.learning import (
    baseline_target,
    curve_frame,
    mean_ci,
    mean_curve_crossing,
    seconds_at_tokens,
)
from trace_core.home.layout import table_dir


def _read(home: Path, table: str, prefix: str) -> pl.DataFrame:
    files = [f for f in sorted(table_dir(home, table).glob("run_id=*/**/*.parquet"))
             if f.name != "_schema.parquet" and any(p.startswith(f"run_id={prefix}") for p in f.parts)]
    return pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed") if files else pl.DataFrame()


def _fmt(vals) -> str:
    vals = [v for v in vals if v == v]
    if not vals:
        return "–"
    m, h = mean_ci(vals)
    return f"{100 * m:.1f}" + (f" ± {100 * h:.1f}" if h == h else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="LABEL=HOME:PREFIX")
    ap.add_argument("--tokens", default="49000,99000,148000,198000", help="comma-separated token checkpoints")
    args = ap.parse_args()
    ticks = [float(t) for t in args.tokens.split(",")]
    rows, base, labelled = [], None, []
    for spec in args.variants:
        label, _, where = spec.partition("=")
        parts = [w.rpartition(":") for w in where.split("+")]  # HOME:PREFIX[+HOME:PREFIX...]
        iters, evals, runs = (pl.concat([f for home, _, prefix in parts if (f := _read(Path(home), t, prefix)).height]
                                        or [pl.DataFrame()], how="vertical_relaxed")
                              for t in ("iterations", "evaluations", "runs"))
        if evals.height == 0:
            raise SystemExit(f"{label}: no evaluations under {where}")
        seed = {r["run_id"]: int(r["seed"]) for r in runs.iter_rows(named=True)}
        curves = curve_frame(iters, evals)
        labelled.append(curves.with_columns(pl.lit(label).alias("strategy")))
        per_run = {}
        for (rid, fam), g in curves.group_by("run_id", "family", maintain_order=True):
            g = g.sort("tokens")
            x, y = g["tokens"].to_numpy(), g["accuracy"].to_numpy()
            per_run.setdefault(seed[rid], {})[fam] = (x, y)
        at = {s: [float(np.interp(t, *c["all"])) if t <= c["all"][0][-1] else float("nan") for t in ticks]
              for s, c in per_run.items()}
        eff = iters.group_by("run_id").agg(pl.col("effective_ratio").mean(), pl.col("tokens").sum())
        rows.append((label, per_run, at, eff))
        if base is None:
            base = at
    allc = pl.concat(labelled, how="vertical_relaxed")
    target = baseline_target(allc, rows[0][0])
    tok0 = mean_curve_crossing(allc, rows[0][0], target)
    sec0 = seconds_at_tokens(allc, rows[0][0], tok0)
    head = " | ".join(f"acc @ {t / 1000:.0f}k tok" for t in ticks)
    print(f"Target of time-to-accuracy: {rows[0][0]}'s final, {100 * target:.1f}%")
    print(f"| variant | seeds | {head} | vs {rows[0][0]} @ {ticks[-1] / 1000:.0f}k (paired) | final | gain | "
          "tokens | effective ratio | math / QA / FC at the end | tokens to target (×) | seconds to target (×) |")
    print("|" + "---|" * (len(ticks) + 10))
    for label, per_run, at, eff in rows:
        cols = [_fmt([at[s][i] for s in at]) for i in range(len(ticks))]
        diff = _fmt([at[s][-1] - base[s][-1] for s in at if s in base])
        final = [c["all"][1][-1] for c in per_run.values()]
        gain = [c["all"][1][-1] - c["all"][1][0] for c in per_run.values()]
        fam = " / ".join(_fmt([c[f][1][-1] for c in per_run.values()]) for f in ("math", "qa", "fc"))
        tok = mean_curve_crossing(allc, label, target)
        sec = seconds_at_tokens(allc, label, tok)
        tta = (f"{tok / 1000:.0f}k ({tok / tok0:.2f}×) | {sec:.0f} ({sec / sec0:.2f}×)" if np.isfinite(tok)
               else "not reached | not reached")
        print(f"| {label} | {len(per_run)} | " + " | ".join(cols) + f" | {diff} | {_fmt(final)} | {_fmt(gain)} | "
              f"{eff['tokens'].mean() / 1000:.0f}k | {100 * eff['effective_ratio'].mean():.1f}% | {fam} | {tta} |")


if __name__ == "__main__":
    main()
