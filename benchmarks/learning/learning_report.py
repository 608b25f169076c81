"""The learning table and plots of every run in a home (or the runs whose id starts with a prefix),
pairing runs across comparisons by their run seed (the `runs` table), e.g. a 3-seed benchmark run as
two `compare` calls:

    PYTHONPATH=. python benchmarks/learning/learning_report.py --home H --prefix learn --out docs/results/learning-tiny

``--curves docs/results/X/learning_curves.csv`` adds an earlier report's runs (paired by run seed).

Prints the markdown table (accuracy at equal tokens with 95% CIs over seeds, paired difference to
GRPO, time-to-accuracy) and the per-family accuracy at the last checkpoint; writes the plots and
CSVs to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl

from trace_core.allocation.strategies import run_label
from trace_core.analysis.learning import at_budget, curve_frame, learning_markdown, learning_table, mean_ci
from trace_core.home.layout import table_dir
from tracking.plots_compare import plot_learning_curves


def _read(home: Path, table: str, prefix: str) -> pl.DataFrame:
    files = [f for f in sorted(table_dir(home, table).glob("run_id=*/**/*.parquet"))
             if f.name != "_schema.parquet"
             and f.parts[-3 if table != "runs" else -2].startswith(tuple(f"run_id={p}" for p in prefix.split(",")))]
    return pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed") if files else pl.DataFrame()


def wall_timings(iters: pl.DataFrame, runs: pl.DataFrame, evals: pl.DataFrame) -> pl.DataFrame:
    """``timings`` replaced by each iteration's wall-clock seconds: the time between its row and the
    previous one (evaluations included, as every run makes the same ones); iteration 0 from the run's
    start, its warm-start evaluation left out."""
    before = (evals.filter((pl.col("iteration") == 0) & (pl.col("split") == "heldout") & (pl.col("family") == "all"))
              .group_by("run_id").agg(pl.col("seconds").first().alias("before_s")))
    it = (iters.sort("run_id", "iteration")
          .join(runs.select("run_id", "started_at"), on="run_id", how="left")
          .join(before, on="run_id", how="left")
          .with_columns(prev=pl.col("created_at").shift(1).over("run_id")))
    wall = (pl.when(pl.col("prev").is_null())
            .then((pl.col("created_at") - pl.col("started_at")).dt.total_microseconds() / 1e6
                  - pl.col("before_s").fill_null(0.0))
            .otherwise((pl.col("created_at") - pl.col("prev")).dt.total_microseconds() / 1e6))
    return (it.with_columns(wall.alias("wall_s"))
            .with_columns(pl.format('{{"wall": {}}}', pl.col("wall_s").round(3)).alias("timings"))
            .drop("started_at", "before_s", "prev", "wall_s"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--prefix", default="", help="only runs whose id starts with this (comma-separated: any of them)")
    ap.add_argument("--out", type=Path, default=None, help="directory for plots and CSVs")
    ap.add_argument("--baseline", default="grpo", help="the row the others are paired with (e.g. grpo@4)")
    ap.add_argument("--curves", type=Path, action="append", default=[],
                    help="add the curves of an earlier report (its learning_curves.csv, run ids <row>-s<seed>); "
                         "its rows pair with this home's by run seed (repeatable)")
    ap.add_argument("--row", action="append", default=[], metavar="RUN_PREFIX=NAME",
                    help="name the row of the runs whose id starts with RUN_PREFIX (a setting --set changed, "
                         "which the config's label does not show), e.g. e192-r=trace+refine (repeatable)")
    ap.add_argument("--clock", choices=("stages", "wall"), default="stages",
                    help="seconds axis: the seven stages' seconds summed (default), or wall-clock seconds "
                         "(a pipelined run overlaps its stages: their sum is work, not time)")
    args = ap.parse_args()
    evals, iters = _read(args.home, "evaluations", args.prefix), _read(args.home, "iterations", args.prefix)
    runs = _read(args.home, "runs", args.prefix)
    if runs.height and "status" in runs.columns:  # a run still training would cut every curve at its tokens
        unfinished = runs.filter(pl.col("status") != "finished")["run_id"].to_list()
        if unfinished:
            print(f"left out (not finished): {', '.join(sorted(unfinished))}")
            evals, iters, runs = (f.filter(~pl.col("run_id").is_in(unfinished)) for f in (evals, iters, runs))
    if evals.height == 0:
        raise SystemExit(f"no evaluations under {args.home} for prefix {args.prefix!r}")
    # pair by run seed: a run's id becomes <row>-s<seed>, its row the strategy with compare's variant
    # marks (grpo@4 when the runs hold several group sizes, trace@rootoracle4: run_label)
    configs = {r["run_id"]: json.loads(r["config_json"] or "{}") for r in runs.iter_rows(named=True)}
    sizes = {c.get("allocation", {}).get("group_size") for c in configs.values()}
    label = {r: run_label(c, len(sizes) > 1) for r, c in configs.items()}
    for spec in args.row:
        run_prefix, sep, name = spec.partition("=")
        if not sep or not run_prefix or not name:
            raise SystemExit(f"--row {spec!r}: expected RUN_PREFIX=NAME")
        label.update({r: name for r in label if r.startswith(run_prefix)})
    seed = {r["run_id"]: r["seed"] for r in runs.iter_rows(named=True)}
    rename = {r: f"{label[r]}-s{seed[r]}" for r in configs}
    evals, iters = (f.with_columns(pl.col("run_id").replace_strict(label, default=pl.col("strategy")).alias("strategy"),
                                   pl.col("run_id").replace_strict(rename, default=pl.col("run_id")))
                    for f in (evals, iters))
    if args.clock == "wall":
        iters = wall_timings(iters, runs.with_columns(pl.col("run_id").replace_strict(rename, default=pl.col("run_id"))),
                             evals)
    curves = curve_frame(iters, evals)
    for csv in args.curves:
        earlier = pl.read_csv(csv).select(curves.columns).cast(dict(curves.schema))
        clash = set(earlier["run_id"].to_list()) & set(curves["run_id"].to_list())
        if clash:
            raise SystemExit(f"{csv}: runs already in {args.home}: {', '.join(sorted(clash))}")
        curves = pl.concat([curves, earlier], how="vertical")
    rows = sorted(set(curves["strategy"].to_list()))
    if args.baseline not in rows:
        raise SystemExit(f"--baseline {args.baseline!r} is not a row here; rows: {', '.join(rows)}")
    order = [args.baseline, *[r for r in rows if r != args.baseline]]
    table, ctx = learning_table(curves, baseline=args.baseline, order=order)
    print(learning_markdown(table, ctx))
    print()
    for f in sorted(set(curves["family"].to_list()) - {"all"}):
        pts = at_budget(curves, (1.0,), family=f)
        cells = []
        for s in order:
            m, h = mean_ci(pts.filter(pl.col("strategy") == s)["accuracy"])
            cells.append(f"{s} {100 * m:.1f}" + (f" ± {100 * h:.1f}" if h == h else ""))
        print(f"* {f}: " + ", ".join(cells))
    probe = evals.filter(pl.col("split") == "probe")
    if probe.height:
        for s in order:
            sub = probe.filter(pl.col("strategy") == s)
            if sub.height == 0:
                continue
            last = int(sub["iteration"].max())  # each strategy's own last evaluation
            a0 = mean_ci(sub.filter(pl.col("iteration") == 0)["accuracy"])[0]
            a1 = mean_ci(sub.filter(pl.col("iteration") == last)["accuracy"])[0]
            print(f"* probe (training prompts), {s}: {100 * a0:.1f} -> {100 * a1:.1f} after {last} iterations")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        curves.write_csv(args.out / "learning_curves.csv")
        table.write_csv(args.out / "learning.csv")
        plot_learning_curves(curves, args.out / "learning_tokens.png", x="tokens")
        plot_learning_curves(curves, args.out / "learning_seconds.png", x="seconds")
        for f in sorted(set(curves["family"].to_list()) - {"all"}):
            plot_learning_curves(curves, args.out / f"learning_tokens_{f}.png", family=f)


if __name__ == "__main__":
    main()
