"""Goal check of the success predictor and the flip model, measured prospectively.

For t = 1..N the predictor is refreshed on every node of iterations < t (one object, warm-started,
saved and reloaded through ``save`` / ``load_predictor`` as the flow does) and then predicts
iteration t's roots (the prompts that were rolled out; outcome: their raw rollouts' success rate, what root allocation
needs) and raw non-leaf prefixes (the nodes prefix allocation scores; outcome: subtree mean) before
their outcomes are looked at. The roots' subtree mean (raw rollouts plus continuations chosen by
prefix allocation: the flow's label today) is printed beside. Per iteration it prints AUC / Brier / ECE
of the model and of the baselines (``constant``: the mean label; ``history``: the prompt's own
record; ``prior``: the hierarchical prior without the head), the *noise floor* of ECE (the mean
ECE of outcomes drawn from the model's own predictions with these sample sizes: what a perfectly
calibrated predictor would score) and, for the continuations of iteration t, predicted vs realised
flip rates per bin, beside the paper's ``r(1-V) + (1-r)V``. Goals: root and prefix
AUC >= 0.80 and ECE <= 0.05 from iteration 1, reported per iteration and as the mean.

Sources:
* ``--run-dir HOME``: node rows of a real run, Parquet shards ``HOME/shards/nodes/run_id=*/iteration=*/final.parquet``
  (``--run-id`` picks one run when the home holds several);
* ``--source synthetic`` (default): SYNTHETIC latent-logit trees from
  ``trace_core.predictor.synthetic`` — not the tiny policy; the figures show the machinery works.
``--cell-prior FILE`` (Parquet or CSV: task, difficulty, n_success, n_total) is handed to every fit
as the held-out evaluation measured before training.

    PYTHONPATH=. .venv/bin/python benchmarks/learning/predictor_goal.py --iterations 5
    PYTHONPATH=. .venv/bin/python benchmarks/learning/predictor_goal.py --run-dir HOME --iterations 7
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from trace_core.predictor import (
    PredictorConfig,
    evaluate_prospective,
    load_predictor,
    make_predictor,
    node_labels,
)
from trace_core.predictor.base import decision_labels
from trace_core.predictor.evaluation import auc, ece
from trace_core.predictor.flip import continuation_pairs
from trace_core.predictor.prior import outcome_counts

GOALS = {"auc": 0.80, "ece": 0.05}
FLIP_BINS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
POOLED: dict[str, list] = {}  # kind -> [(iteration, p, y, w)], every prospective prediction of the run


def load_run(run_dir: Path, run_id: str | None) -> pl.DataFrame:
    files = sorted(run_dir.glob(f"shards/nodes/run_id={run_id or '*'}/iteration=*/final.parquet"))
    if not files:
        raise SystemExit(f"no node shards under {run_dir}/shards/nodes/run_id={run_id or '*'}/iteration=*/final.parquet")
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")


def load_source(args) -> tuple[pl.DataFrame, str]:
    if args.run_dir:
        return load_run(Path(args.run_dir), args.run_id), f"run directory {args.run_dir}"
    from trace_core.predictor.synthetic import synthetic_run

    return synthetic_run(args.iterations + 1, seed=args.seed), "SYNTHETIC latent-logit trees (not the tiny policy)"


def load_cell_prior(path: str | None) -> pl.DataFrame | None:
    if not path:
        return None
    return pl.read_csv(path) if path.endswith(".csv") else pl.read_parquet(path)


def eval_mask(df: pl.DataFrame) -> np.ndarray:
    """Labelled roots, and the labelled raw non-leaf prefixes that prefix allocation scores."""
    depth = df["depth"].fill_null(0).to_numpy()
    origin = df["origin"].fill_null("raw").to_numpy()
    leaf = df["is_leaf"].fill_null(False).to_numpy()
    lab = (df["subtree_count"].fill_null(0).to_numpy() > 0) & df["subtree_mean_reward"].is_not_null().to_numpy()
    return lab & ((depth == 0) | ((depth > 0) & (origin == "raw") & ~leaf))


def ece_floor(p: np.ndarray, w: np.ndarray, seed: int, draws: int = 200) -> float:
    """Mean ECE of outcomes drawn from ``p`` itself (trajectory counts ``w``): the sampling noise."""
    rng = np.random.default_rng(seed)
    n = np.maximum(np.round(w).astype(int), 1)
    return float(np.mean([ece(p, rng.binomial(n, p) / n, n) for _ in range(draws)]))


def flip_table(pred, frame: pl.DataFrame, v: np.ndarray) -> dict:
    """Predicted vs realised flips of iteration ``frame``'s continuations, per predicted-flip bin and
    per (r, depth); ``v`` ``(n,)`` = the success predictions of ``frame`` (for the paper's formula)."""
    pairs = continuation_pairs(frame)
    if pairs.height == 0:
        return {}
    rows = pl.DataFrame({"node_id": frame["node_id"], "row": np.arange(frame.height)})
    pairs = pairs.join(rows, on="node_id")
    br = frame[pairs["row"].to_numpy()].with_columns(pl.Series("r", pairs["r"]))
    q = pred.predict_flip(br, nodes=frame.filter(pl.col("origin") != "extension"))  # as at prefix scoring
    r, n, f = pairs["r"].to_numpy(), pairs["n"].to_numpy(), pairs["f"].to_numpy()
    vv = v[pairs["row"].to_numpy()]
    paper = np.where(r > 0.5, 1 - vv, vv)
    out = {"n": float(n.sum()), "realised": float(f.sum() / n.sum()), "predicted": float(np.sum(n * q) / n.sum()),
           "paper": float(np.sum(n * paper) / n.sum()), "auc": auc(q, f / n, n), "ece": ece(q, f / n, n),
           "paper_ece": ece(paper, f / n, n), "bins": []}  # fmt: skip
    b = np.digitize(q, FLIP_BINS[1:-1])
    for k in range(len(FLIP_BINS) - 1):
        m = b == k
        if m.any():
            out["bins"].append({"lo": FLIP_BINS[k], "hi": FLIP_BINS[k + 1], "continuations": float(n[m].sum()),
                                "predicted": float(np.sum(n[m] * q[m]) / n[m].sum()),
                                "realised": float(f[m].sum() / n[m].sum())})  # fmt: skip
    d = np.minimum(br["depth"].to_numpy(), 3)
    out["by_r_depth"] = [{"r": int(rv), "depth": int(dv), "continuations": float(n[m].sum()),
                          "predicted": float(np.sum(n[m] * q[m]) / n[m].sum()),
                          "paper": float(np.sum(n[m] * paper[m]) / n[m].sum()), "realised": float(f[m].sum() / n[m].sum())}
                         for rv in (0, 1) for dv in sorted(set(d.tolist())) if (m := (r == rv) & (d == dv)).any()]  # fmt: skip
    return out


def run(args) -> dict:
    nodes, source = load_source(args)
    its = sorted(nodes["iteration"].unique().drop_nulls().to_list())
    cfg = PredictorConfig.model_validate(json.loads(args.config)) if args.config else PredictorConfig()
    cell_prior = load_cell_prior(args.cell_prior)
    pred = make_predictor(cfg)
    print(f"source: {source}; {nodes.height} nodes, iterations {its}; predictor {cfg.name}; "
          f"cell prior {'from ' + args.cell_prior if cell_prior is not None else 'none'}")  # fmt: skip
    results, tmp = {}, Path(tempfile.mkdtemp(prefix="predictor_goal_"))
    first = 0 if cell_prior is not None else 1  # with a cell prior, iteration 0 is predicted too
    for t in its[first : args.iterations + 1]:
        t0 = time.perf_counter()
        report = pred.fit(nodes.filter(pl.col("iteration") < t), cell_prior=cell_prior)
        pred = load_predictor(pred.save(tmp / f"predictor-{t}.safetensors"))  # as the flow hands it on
        frame = nodes.filter(pl.col("iteration") == t)
        p = pred.predict(frame)  # prospective: nothing of iteration t was fitted
        base = pred.predict_baselines(frame)
        m = eval_mask(frame)
        scored = frame.filter(pl.Series(m))
        y, w = decision_labels(scored, outcome_counts(frame))  # roots: raw-rollout success rate
        kind = scored["depth"].fill_null(0).to_numpy() == 0
        res = evaluate_prospective(p[m], y, w, kind, baselines={k: v[m] for k, v in base.items()})
        ys, ws = node_labels(scored.filter(pl.Series(kind)))  # the flow's label today: subtree incl. continuations
        res["root_subtree"] = {"auc": auc(p[m][kind], ys, ws), "ece": ece(p[m][kind], ys, ws)}
        for name, s in (("root", kind), ("prefix", ~kind)):
            if name in res:
                res[name]["ece_floor"] = ece_floor(p[m][s], w[s], seed=args.seed + t)
        if "true_p" in frame.columns:  # synthetic only: the (approximate) oracle ceiling
            tp = frame.filter(pl.Series(m))["true_p"].to_numpy()
            res["oracle"] = {k: {"auc": auc(tp[s], y[s], w[s]), "ece": ece(tp[s], y[s], w[s])}
                             for k, s in (("root", kind), ("prefix", ~kind))}  # fmt: skip
        for name, s in (("root", kind), ("prefix", ~kind)):
            POOLED.setdefault(name, []).append((t, p[m][s], y[s], w[s]))
        res["flip"] = flip_table(pred, frame, p)
        res["fit"] = report.model_dump()
        res["seconds"] = time.perf_counter() - t0
        results[t] = res
        print_iteration(t, res)
    return results


def print_iteration(t: int, res: dict) -> None:
    fit = res["fit"]
    prior = fit.get("prior", {})
    print(f"\niteration {t}: fit on {fit['n_labelled']} labelled nodes ({fit['n_train']} train, {fit['steps']} steps "
          f"of {fit['batch_size']}, warm={fit['warm_start']}; k_cell {prior.get('kappa_cell', float('nan')):.1f}, "
          f"k_prompt {prior.get('kappa_prompt', float('nan')):.1f}; calib "
          f"{ {k: v.get('method') for k, v in fit['calib'].items()} }) in {res['seconds']:.1f}s")  # fmt: skip
    for kind in ("root", "prefix"):
        if kind not in res:
            continue
        e = res[kind]
        cols = "  ".join(f"{name}: AUC {e[name]['auc']:.3f} Brier {e[name]['brier']:.3f} ECE {e[name]['ece']:.3f}"
                         for name in ("model", "prior", "history", "constant") if name in e)  # fmt: skip
        oracle = res.get("oracle", {}).get(kind)
        tail = f"  [oracle AUC {oracle['auc']:.3f} ECE {oracle['ece']:.3f}]" if oracle is not None else ""
        print(f"  {kind:6s} n={e['n']:4d} mean p {e['model']['mean_pred']:.2f} vs y {e['model']['mean_outcome']:.2f} "
              f"(ECE floor {e['ece_floor']:.3f})  {cols}{tail}")  # fmt: skip
    rs = res.get("root_subtree")
    if rs:
        print(f"  root against subtree_mean_reward (raw + continuations, the flow's label): AUC {rs['auc']:.3f} "
              f"ECE {rs['ece']:.3f}")  # fmt: skip
    fl = res.get("flip")
    if fl:
        print(f"  flips  {fl['n']:.0f} continuations: realised {fl['realised']:.3f}, predicted {fl['predicted']:.3f} "
              f"(AUC {fl['auc']:.3f} ECE {fl['ece']:.3f}); paper r(1-V)+(1-r)V {fl['paper']:.3f} (ECE {fl['paper_ece']:.3f})")
        print("         by predicted bin: " + "  ".join(
            f"[{b['lo']:.2f},{b['hi']:.2f}) n={b['continuations']:.0f} {b['predicted']:.3f}->{b['realised']:.3f}"
            for b in fl["bins"]))  # fmt: skip
        print("         by (r, depth):    " + "  ".join(
            f"r{b['r']}d{b['depth']} n={b['continuations']:.0f} {b['predicted']:.2f}/{b['paper']:.2f}->{b['realised']:.2f}"
            for b in fl["by_r_depth"]))  # fmt: skip


def summary(results: dict) -> list[tuple[str, float, float, bool]]:
    """Mean over the evaluated iterations of each goal metric, with its goal and whether it is met."""
    rows = []
    later = [r for t, r in results.items() if t >= 1]
    for kind in ("root", "prefix"):
        for metric, op in (("auc", ">="), ("ece", "<=")):
            vals = [r[kind]["model"][metric] for r in later if kind in r and np.isfinite(r[kind]["model"][metric])]
            v = float(np.mean(vals)) if vals else float("nan")
            ok = v >= GOALS[metric] if op == ">=" else v <= GOALS[metric]
            rows.append((f"{kind} {metric.upper()}", v, GOALS[metric], bool(ok)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", default=None, help="run home with shards/nodes/run_id=*/iteration=*/final.parquet")
    ap.add_argument("--run-id", default=None, help="one run of that home (default: every run in it)")
    ap.add_argument("--source", choices=["synthetic"], default="synthetic")
    ap.add_argument("--cell-prior", default=None, help="held-out per-cell outcomes before training (parquet/csv)")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=None, help="PredictorConfig as JSON")
    ap.add_argument("--json-out", default=None, help="write all results as JSON here")
    args = ap.parse_args(argv)
    results = run(args)
    if not results:
        print("no iteration after the first: nothing to evaluate prospectively")
        return 1
    print(f"\nmean over iterations 1..{max(results)} (each predicted before its outcomes):")
    floors = {k: np.mean([r[k]["ece_floor"] for t, r in results.items() if k in r and t >= 1]) for k in ("root", "prefix")}
    for name, value, goal, ok in summary(results):
        op = ">=" if "AUC" in name else "<="
        note = f"  (ECE noise floor {floors[name.split()[0]]:.3f})" if "ECE" in name else ""
        print(f"  {name:10s} {value:.3f}  (goal {op} {goal:.2f})  {'MET' if ok else 'NOT MET'}{note}")
    for kind, parts in POOLED.items():
        p, y, w = (np.concatenate([x[i] for x in parts if x[0] >= 1]) for i in (1, 2, 3))
        print(f"  pooled {kind:6s} (all {len(p)} predictions of iterations >= 1): AUC {auc(p, y, w):.3f} "
              f"ECE {ece(p, y, w):.3f}")  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1, default=float))
    return 0 if all(ok for *_, ok in summary(results)) else 2


if __name__ == "__main__":
    raise SystemExit(main())
