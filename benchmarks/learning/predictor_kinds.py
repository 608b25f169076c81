"""How well the predictor does per kind of decision: roots of prompts never sampled before in the
run, roots of prompts it has sampled before (the epochs setting's history), and prefixes.

    PYTHONPATH=. python benchmarks/learning/predictor_kinds.py --home /tmp/ep --runs ep-trace

For every run whose id starts with one of ``--runs``: each prediction made before its outcome
(the ``predictions`` view: roots in stage 2, prefixes in stage 4) is one of ``root-unseen``,
``root-seen`` (the prompt was sampled in an earlier iteration of the same run) or ``prefix``.
Prints, per kind, the weighted Brier score, AUC and ECE (``trace_core.predictor.evaluation``)
over all iterations and per iteration, the AUC within each family (ranking inside a family is
what selection needs: the family's share is fixed by ``allocation.stratify``), and the Brier
score of the best constant per (family, iteration) — the outcome rate itself, known only after
the fact — as the bar a per-prompt predictor has to clear.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import polars as pl

from trace_core.predictor.evaluation import auc, brier, ece
from trace_core.store import query

SQL = ("SELECT s.run_id, s.iteration, s.node_id, s.prompt_id, s.task, c.difficulty, s.kind, s.v_pred, s.outcome, "
       "s.weight FROM scored_predictions(NULL) s LEFT JOIN (SELECT DISTINCT run_id, prompt_id, difficulty "
       "FROM prompts) c USING (run_id, prompt_id)")


def with_kinds(rows: pl.DataFrame) -> pl.DataFrame:
    """``kind2``: root-seen when the run sampled the prompt's root in an earlier iteration."""
    first = (rows.filter(pl.col("kind") == "root").group_by("run_id", "prompt_id")
             .agg(pl.col("iteration").min().alias("first_iteration")))
    out = rows.join(first, on=["run_id", "prompt_id"], how="left")
    return out.with_columns(
        pl.when(pl.col("kind") == "prefix").then(pl.lit("prefix"))
        .when(pl.col("iteration") > pl.col("first_iteration")).then(pl.lit("root-seen"))
        .otherwise(pl.lit("root-unseen")).alias("kind2"))


def scores(sub: pl.DataFrame) -> dict:
    p, y, w = sub["v_pred"].to_numpy(), sub["outcome"].to_numpy(), sub["weight"].to_numpy()
    within = [auc(g["v_pred"].to_numpy(), g["outcome"].to_numpy(), g["weight"].to_numpy())
              for _, g in sub.group_by("task")]
    cell = sub.with_columns(((pl.col("outcome") * pl.col("weight")).sum().over("task", "iteration")
                             / pl.col("weight").sum().over("task", "iteration")).alias("c"))
    return {"n": sub.height, "brier": brier(p, y, w), "auc": auc(p, y, w),
            "auc_within_family": float(np.nanmean(within)) if within else float("nan"),
            "ece": ece(p, y, w), "brier_family_rate": brier(cell["c"].to_numpy(), y, w),
            "mean_pred": float(np.average(p, weights=w)), "mean_outcome": float(np.average(y, weights=w))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", required=True)
    ap.add_argument("--runs", required=True, help="comma-separated run id prefixes")
    ap.add_argument("--per-iteration", action="store_true", help="also one row per (kind, iteration)")
    ap.add_argument("--by-family", action="store_true",
                    help="also one row per (kind, family), with the AUC within each (family, difficulty) cell")
    args = ap.parse_args()
    prefixes = tuple(p for p in args.runs.split(",") if p)
    rows = query(args.home, SQL)
    rows = rows.filter(pl.col("run_id").str.starts_with(prefixes[0]) if len(prefixes) == 1 else
                       pl.any_horizontal(*[pl.col("run_id").str.starts_with(p) for p in prefixes]))
    if rows.height == 0:
        raise SystemExit(f"no scored predictions for runs starting with {args.runs!r} in {args.home}")
    rows = with_kinds(rows)
    print(f"{rows['run_id'].n_unique()} runs, {rows.height} scored predictions; load {os.getloadavg()[0]:.1f}")
    head = ("| kind | predictions | Brier | Brier of the family's rate | AUC | AUC within family | ECE "
            "| mean pred | mean outcome |")
    print(head + "\n|" + "---|" * 9)
    for kind in ("root-unseen", "root-seen", "prefix"):
        sub = rows.filter(pl.col("kind2") == kind)
        if sub.height == 0:
            continue
        s = scores(sub)
        print(f"| {kind} | {s['n']} | {s['brier']:.4f} | {s['brier_family_rate']:.4f} | {s['auc']:.3f} "
              f"| {s['auc_within_family']:.3f} | {s['ece']:.3f} | {s['mean_pred']:.3f} | {s['mean_outcome']:.3f} |")
    if args.by_family:
        print("\n| kind | family | predictions | Brier | AUC | AUC within cell | mean pred | mean outcome |\n"
              "|---|---|---|---|---|---|---|---|")
        for (kind, fam), sub in sorted(rows.filter(pl.col("kind2") != "prefix").group_by("kind2", "task"),
                                       key=lambda kv: kv[0]):
            s = scores(sub)
            cells = [auc(g["v_pred"].to_numpy(), g["outcome"].to_numpy(), g["weight"].to_numpy())
                     for _, g in sub.group_by("difficulty")]
            print(f"| {kind} | {fam} | {s['n']} | {s['brier']:.4f} | {s['auc']:.3f} | {np.nanmean(cells):.3f} "
                  f"| {s['mean_pred']:.3f} | {s['mean_outcome']:.3f} |")
    if args.per_iteration:
        print("\n| kind | iteration | predictions | Brier | AUC | AUC within family | ECE |\n|---|---|---|---|---|---|---|")
        for (kind, it), sub in sorted(rows.group_by("kind2", "iteration"), key=lambda kv: (kv[0][0], kv[0][1])):
            s = scores(sub)
            print(f"| {kind} | {it} | {s['n']} | {s['brier']:.4f} | {s['auc']:.3f} | {s['auc_within_family']:.3f} "
                  f"| {s['ece']:.3f} |")


if __name__ == "__main__":
    main()
