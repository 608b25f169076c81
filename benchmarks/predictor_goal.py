"""Goal check of the shared success predictor, measured prospectively.

For t = 1..N the predictor is refreshed on every labelled node of iterations < t and then predicts
iteration t's roots (the candidate prompts) and raw non-leaf prefixes (the nodes prefix allocation
scores) before their outcomes are looked at. Prints per-iteration metrics, the two baselines
(constant mean; history only) and, after N iterations, the goal:
prefix AUC >= 0.80, root AUC >= 0.75, ECE <= 0.05 (roots and prefixes each).

Sources:
* ``--run-dir DIR``: node rows of a real run, Parquet shards ``DIR/shards/nodes/run=*/iter=*/final.parquet``;
* ``--source simulate``: trees from ``trace_core.simulate`` (the oracle simulator) when it offers
  ``simulate_nodes``; otherwise falls back to ``synthetic`` and says so;
* ``--source synthetic`` (default): SYNTHETIC latent-logit trees from
  ``trace_core.predictor.synthetic`` — not the tiny policy; the figures show the machinery works,
  not that the real goal is met.

    PYTHONPATH=. .venv/bin/python benchmarks/predictor_goal.py --iterations 5
    PYTHONPATH=. .venv/bin/python benchmarks/predictor_goal.py --run-dir runs/<id> --iterations 5
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.predictor import PredictorConfig, evaluate_prospective, make_predictor, node_labels
from trace_core.predictor.base import labelled
from trace_core.predictor.evaluation import auc, ece

GOALS = {"prefix_auc": 0.80, "root_auc": 0.75, "ece": 0.05}


def load_run(run_dir: Path) -> pl.DataFrame:
    files = sorted(run_dir.glob("shards/nodes/run=*/iter=*/final.parquet"))
    if not files:
        raise SystemExit(f"no node shards under {run_dir}/shards/nodes/run=*/iter=*/final.parquet")
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")


def load_source(args) -> tuple[pl.DataFrame, str]:
    if args.run_dir:
        return load_run(Path(args.run_dir)), f"run directory {args.run_dir}"
    if args.source == "simulate":
        try:
            sim = importlib.import_module("trace_core.simulate")
            return sim.simulate_nodes(
                args.iterations + 1, seed=args.seed
            ), "oracle simulator (trace_core.simulate)"
        except (ImportError, AttributeError) as e:
            print(
                f"[note] trace_core.simulate has no simulate_nodes ({e}); using SYNTHETIC trees",
                file=sys.stderr,
            )
    from trace_core.predictor.synthetic import synthetic_run

    return synthetic_run(
        args.iterations + 1, seed=args.seed
    ), "SYNTHETIC latent-logit trees (not the tiny policy)"


def eval_mask(df: pl.DataFrame) -> np.ndarray:
    """Roots, and the raw non-leaf prefixes that prefix allocation scores."""
    depth = df["depth"].fill_null(0).to_numpy()
    origin = df["origin"].fill_null("raw").to_numpy()
    leaf = df["is_leaf"].fill_null(False).to_numpy()
    return (depth == 0) | ((depth > 0) & (origin == "raw") & ~leaf)


def run(args) -> dict:
    nodes, source = load_source(args)
    its = sorted(nodes["iteration"].unique().drop_nulls().to_list())
    cfg = PredictorConfig.model_validate(json.loads(args.config)) if args.config else PredictorConfig()
    pred = make_predictor(cfg)
    print(f"source: {source}; {nodes.height} nodes, iterations {its}; predictor {cfg.name}")
    results = {}
    for t in its[1 : args.iterations + 1]:
        t0 = time.perf_counter()
        report = pred.fit(nodes.filter(pl.col("iteration") < t))
        frame = nodes.filter(pl.col("iteration") == t)
        p = pred.predict(frame)  # prospective: nothing of iteration t was fitted
        base = pred.predict_baselines(frame)
        m = eval_mask(frame) & labelled_mask(frame)
        y, w = node_labels(frame.filter(m))
        kind = frame.filter(m)["depth"].fill_null(0).to_numpy() == 0
        res = evaluate_prospective(p[m], y, w, kind, baselines={k: v[m] for k, v in base.items()})
        if "true_p" in frame.columns:  # synthetic only: the (approximate) oracle ceiling
            tp = frame.filter(m)["true_p"].to_numpy()
            res["oracle"] = {k: {"auc": auc(tp[s], y[s], w[s]), "ece": ece(tp[s], y[s], w[s])}
                             for k, s in (("root", kind), ("prefix", ~kind))}  # fmt: skip
        res["fit"] = report.as_dict()
        res["seconds"] = time.perf_counter() - t0
        results[t] = res
        print_iteration(t, res)
    return results


def labelled_mask(frame: pl.DataFrame) -> np.ndarray:
    lab_ids = set(labelled(frame)["node_id"].to_list())
    return np.array([nid in lab_ids for nid in frame["node_id"].to_list()])


def print_iteration(t: int, res: dict) -> None:
    fit = res["fit"]
    print(f"\niteration {t}: fit on {fit['n_labelled']} labelled nodes ({fit['n_train']} train, "
          f"{fit['n_calib']} calib, warm={fit['warm_start']}) in {fit['seconds']:.1f}s")  # fmt: skip
    for kind in ("root", "prefix"):
        if kind not in res:
            continue
        e = res[kind]
        line = "  ".join(
            f"{name}: AUC {e[name]['auc']:.3f} Brier {e[name]['brier']:.3f} ECE {e[name]['ece']:.3f}"
            + (
                f" (mean p {e[name]['mean_pred']:.2f} vs y {e[name]['mean_outcome']:.2f})"
                if name == "model"
                else ""
            )
            for name in ("model", "history", "constant")
            if name in e
        )
        oracle = res.get("oracle", {}).get(kind)
        tail = f"  [oracle AUC {oracle['auc']:.3f} ECE {oracle['ece']:.3f}]" if oracle is not None else ""
        print(f"  {kind:6s} n={e['n']:5d}  {line}{tail}")


def goal_lines(final: dict) -> list[tuple[str, float, float, bool]]:
    def get(kind, metric):
        return final.get(kind, {}).get("model", {}).get(metric, float("nan"))

    rows = [
        (
            "prefix AUC",
            get("prefix", "auc"),
            GOALS["prefix_auc"],
            get("prefix", "auc") >= GOALS["prefix_auc"],
        ),
        ("root AUC", get("root", "auc"), GOALS["root_auc"], get("root", "auc") >= GOALS["root_auc"]),
        ("prefix ECE", get("prefix", "ece"), GOALS["ece"], get("prefix", "ece") <= GOALS["ece"]),
        ("root ECE", get("root", "ece"), GOALS["ece"], get("root", "ece") <= GOALS["ece"]),
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", default=None, help="real run directory with shards/nodes/run=*/iter=*/final.parquet")
    ap.add_argument("--source", choices=["synthetic", "simulate"], default="synthetic")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=None, help="PredictorConfig as JSON")
    ap.add_argument("--json-out", default=None, help="write all results as JSON here")
    args = ap.parse_args(argv)
    results = run(args)
    if not results:
        print("no iteration after the first: nothing to evaluate prospectively")
        return 1
    last = max(results)
    print(f"\nafter {last} iterations (predictions for iteration {last}, fitted on iterations < {last}):")
    ok_all = True
    for name, value, goal, ok in goal_lines(results[last]):
        op = ">=" if "AUC" in name else "<="
        ok_all &= bool(ok)
        print(f"  {name:11s} {value:.3f}  (goal {op} {goal:.2f})  {'MET' if ok else 'NOT MET'}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1, default=float))
    return 0 if ok_all else 2


if __name__ == "__main__":
    raise SystemExit(main())
