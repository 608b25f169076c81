"""Prospective predictor quality of finished runs, from their predictions shards.

Each prediction (made before its outcome: roots in stage 2, prefixes in stage 4) is expanded into
its individual 0/1 outcomes (outcome rate x weight) and scored with ROC AUC and ECE (10 bins),
pooled over the iterations from ``--from-iteration`` and per iteration, per strategy and kind.

    python benchmarks/learning/predictor_scores.py --home H --run-prefix full-
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.metrics import roc_auc_score


def expand(frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, 0/1 outcomes), one pair per trajectory behind each prediction."""
    p, y = [], []
    for v, o, w in frame.select("v_pred", "outcome", "weight").iter_rows():
        n = int(round(w or 1.0))
        s = int(round((o or 0.0) * n))
        y += [1] * s + [0] * (n - s)
        p += [v] * n
    return np.asarray(p, dtype=float), np.asarray(y, dtype=int)


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    b = np.minimum((p * bins).astype(int), bins - 1)
    return float(sum((b == k).mean() * abs(p[b == k].mean() - y[b == k].mean()) for k in range(bins) if (b == k).any()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, type=Path)
    ap.add_argument("--run-prefix", default="", help="Only runs whose id starts with this.")
    ap.add_argument("--from-iteration", type=int, default=1)
    a = ap.parse_args()
    files = sorted((a.home / "shards" / "predictions").glob("run=*/iter=*/final.parquet"))
    frame = pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed")
    frame = frame.filter(pl.col("run_id").str.starts_with(a.run_prefix) & (pl.col("iteration") >= a.from_iteration))
    frame = frame.with_columns(pl.col("run_id").map_elements(
        lambda r: re.sub(r"-s\d+$", "", r[len(a.run_prefix):]), return_dtype=pl.Utf8).alias("who"))
    print(f"{'runs':14s} {'kind':6s} {'outcomes':>8s}  pooled AUC  ECE    per-iteration AUC  ECE")
    for (who, kind), sub in sorted(frame.group_by("who", "kind"), key=lambda t: t[0]):
        p, y = expand(sub)
        per = []
        for _, g in sub.group_by("run_id", "iteration"):
            pp, yy = expand(g)
            if len(set(yy.tolist())) > 1:
                per.append((roc_auc_score(yy, pp), ece(pp, yy)))
        per_a = np.asarray(per) if per else np.full((1, 2), np.nan)
        auc = roc_auc_score(y, p) if len(set(y.tolist())) > 1 else float("nan")
        print(f"{who:14s} {kind:6s} {len(y):8d}  {auc:10.3f}  {ece(p, y):.3f}  {per_a[:, 0].mean():17.3f}  "
              f"{per_a[:, 1].mean():.3f}")


if __name__ == "__main__":
    main()
