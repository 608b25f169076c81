"""Does a prompt's own record, re-weighted to the current policy, predict its current success rate?

A prompt's earlier raw trajectories were sampled by older weights. Their rewards, importance-weighted
by ``π_now(τ) / π_then(τ)`` (one forward pass of the stored trajectories under the checkpoint that
samples this step, against the behaviour log-probs stored with every node), estimate the success
rate under the current weights without sampling. This probe scores that estimate prospectively on a
finished run: for every prompt sampled at step t ≥ 1 that had raw trajectories before t, the
estimate made with checkpoint t-1's weights against the step's realized success rate, beside the
stored prediction (``v_pred``) and the plain record (the mean of the earlier rewards).

    PYTHONPATH=. python benchmarks/learning/history_is_probe.py --home H --run-id RUN \
        --config configs/learning-epochs-192.yaml --set run.seed=1

``--shifted PREFIX`` instead scores runs made with ``predictor.history_shift`` on: the picked roots
whose prediction the shift moved, their prediction before it (``v_unshifted``) against after
(``v_pred``), Brier and log-loss against the step's outcomes, per family.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import spearmanr

from benchmarks.learning.predictor_goal import load_run
from trace_core.config import load_train_config
from trace_core.policy.update import build_sequences
from trace_core.predictor.calibration import sigmoid
from trace_core.predictor.config import HistoryShiftConfig
from trace_core.runtime import Runtime
from trace_core.stages.history_shift import _logit, fit_slope, log_weights
from trace_core.stages.prompt_pools import training_set


def estimates(rewards: np.ndarray, logw: np.ndarray, ages: np.ndarray, alpha: float) -> dict[str, float]:
    """One prompt's estimates from its earlier trajectories (rewards, log-ratios, ages in steps)."""
    w = np.exp(alpha * (logw - logw.max()))
    ess = w.sum() ** 2 / max((w ** 2).sum(), 1e-12)
    last = ages == ages.min()
    return {"record": float(rewards.mean()), "last": float(rewards[last].mean()),
            "snis": float((w * rewards).sum() / w.sum()), "ess": float(ess), "n_hist": float(len(rewards)),
            "drift": float(logw[rewards > 0.5].mean() - logw[rewards <= 0.5].mean())
            if 0 < rewards.sum() < len(rewards) else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--config", default="configs/learning-epochs-192.yaml")
    ap.add_argument("--set", action="append", default=[], help="config override of the run (repeatable)")
    ap.add_argument("--alpha", type=float, action="append", default=None,
                    help="tempering of the weights w**alpha (repeatable; default 1 and 0.5)")
    ap.add_argument("--out", default=None, help="write the per-(step, prompt) table here (Parquet)")
    ap.add_argument("--shifted", default=None, metavar="PREFIX",
                    help="score the shift of the runs whose id starts with PREFIX instead (no --run-id needed)")
    args = ap.parse_args()
    if args.shifted:
        return shifted_report(Path(args.home), args.shifted)
    if not args.run_id:
        ap.error("--run-id is needed (or --shifted PREFIX)")
    alphas = args.alpha or [1.0, 0.5]
    home = Path(args.home)
    cfg = load_train_config(args.config, args.set)
    nodes = load_run(home, args.run_id)
    raw = nodes.filter(pl.col("origin").fill_null("raw") == "raw")
    leaves = raw.filter(pl.col("is_leaf") & (pl.col("depth") > 0))
    prompts = pl.concat([pl.read_parquet(f) for f in
                         sorted(home.glob(f"shards/prompts/run_id={args.run_id}/iteration=*/*.parquet"))],
                        how="diagonal_relaxed").filter(pl.col("m_alloc") > 0)
    tasks = {t.prompt_id: t for t in training_set(cfg)}
    ckpt_dir = home / "runs" / args.run_id / "checkpoints"
    rows, t0 = [], time.perf_counter()
    with Runtime(cfg) as rt:
        messages = {p: rt.envs[t.family].reset(t).messages() for p, t in tasks.items()}
        last_it = int(leaves["iteration"].max())
        for it in range(1, last_it + 1):
            ckpt = ckpt_dir / f"iter={it - 1:05d}"
            if not ckpt.is_dir():
                print(f"step {it}: no checkpoint {ckpt.name}, skipped")
                continue
            now = leaves.filter(pl.col("iteration") == it).group_by("prompt_id").agg(
                (pl.col("reward") > 0.5).mean().alias("rate"), pl.len().alias("n"))
            past_ids = set(now["prompt_id"].to_list())
            past = nodes.filter((pl.col("iteration") < it) & pl.col("prompt_id").is_in(list(past_ids)))
            raw_ids = set(leaves.filter(pl.col("iteration") < it)["trajectory_id"].to_list())
            if past.height == 0:
                continue
            policy = rt.live.get(str(ckpt))
            seqs = [s for s in build_sequences(past, policy.chat, messages, skip_zero_advantage=False)
                    if s.trajectory_id in raw_ids]  # raw rollouts only: a continuation is a selected sample
            logw = log_weights(policy.model, seqs, policy.tokenizer.pad_token_id, cfg.sampling.temperature)
            meta = {r["trajectory_id"]: r for r in past.filter(pl.col("is_leaf") & (pl.col("depth") > 0))
                    .select("trajectory_id", "prompt_id", "iteration", "reward").iter_rows(named=True)}
            by_prompt: dict[str, list] = {}
            for s, lw in zip(seqs, logw, strict=True):
                m = meta[s.trajectory_id]
                by_prompt.setdefault(m["prompt_id"], []).append((float(m["reward"] > 0.5), lw, it - m["iteration"]))
            pv = prompts.filter(pl.col("iteration") == it).select("prompt_id", "task", "difficulty", "v_pred")
            pv = {r["prompt_id"]: r for r in pv.iter_rows(named=True)}
            for r in now.iter_rows(named=True):
                hist = by_prompt.get(r["prompt_id"])
                if not hist or r["prompt_id"] not in pv:
                    continue
                h = np.array(hist)
                row = {"iteration": it, "prompt_id": r["prompt_id"], "task": pv[r["prompt_id"]]["task"],
                       "difficulty": pv[r["prompt_id"]]["difficulty"], "v_pred": pv[r["prompt_id"]]["v_pred"],
                       "rate": r["rate"], "n": r["n"], "mean_logw": float(h[:, 1].mean())}
                for a in alphas:
                    e = estimates(h[:, 0], h[:, 1], h[:, 2], a)
                    row.update({"record": e["record"], "last": e["last"], "n_hist": e["n_hist"],
                                "drift": e["drift"], f"snis{a:g}": e["snis"], f"ess{a:g}": e["ess"]})
                rows.append(row)
            print(f"step {it}: {len(seqs)} earlier trajectories of {len(by_prompt)} prompts scored "
                  f"({time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    frame = pl.DataFrame(rows)
    if args.out:
        frame.write_parquet(args.out)
    report(frame, alphas)


def shifted_report(home: Path, prefix: str) -> None:
    files = sorted(home.glob(f"shards/prompts/run_id={prefix}*/iteration=*/final.parquet"))
    if not files:
        raise SystemExit(f"no prompts shards under {home}/shards/prompts/run_id={prefix}*")
    d = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed").filter(
        (pl.col("m_alloc") > 0) & (pl.col("v_pred") != pl.col("v_unshifted")))
    runs = d["run_id"].n_unique()
    print(f"{d.height} picked roots moved by the shift in {runs} runs; prediction before -> after")
    print(f"{'family':8} {'n':>5} {'Brier':>17} {'log-loss':>17}")
    for fam in sorted(d["task"].unique()) + ["all"]:
        f = d if fam == "all" else d.filter(pl.col("task") == fam)
        s, n = f["n_success"].to_numpy(), f["n_total"].to_numpy()
        out = []
        for c in ("v_unshifted", "v_pred"):
            p = np.clip(f[c].to_numpy().astype(float), 1e-4, 1 - 1e-4)
            out.append((float(((p - s / n) ** 2).mean()), float(-(s * np.log(p) + (n - s) * np.log1p(-p)).sum() / n.sum())))
        print(f"{fam:8} {f.height:5d} {out[0][0]:7.4f} -> {out[1][0]:.4f} {out[0][1]:7.4f} -> {out[1][1]:.4f}")


def report(frame: pl.DataFrame, alphas: list[float]) -> None:
    cols = ["v_pred", "record", "last"] + [f"snis{a:g}" for a in alphas]
    print(f"\n{frame.height} (step, prompt) pairs with an earlier record; Brier against the step's rate "
          "(lower is better) and Spearman within (family, difficulty), mean over cells")
    print(f"{'family':8} {'n':>5} " + " ".join(f"{c:>16}" for c in cols))
    for fam in sorted(frame["task"].unique()) + ["all"]:
        f = frame if fam == "all" else frame.filter(pl.col("task") == fam)
        cells = []
        for c in cols:
            brier = float(((f[c] - f["rate"]) ** 2).mean())
            rho = [spearmanr(g[c], g["rate"]).statistic for _, g in f.group_by("difficulty")
                   if g.height > 5 and g[c].n_unique() > 1 and g["rate"].n_unique() > 1]
            cells.append(f"{brier:7.4f} {np.nanmean(rho) if rho else float('nan'):+7.2f} ")
        print(f"{fam:8} {f.height:5d} " + " ".join(cells))
    # does the weight add to the prediction? the residual of v_pred against the drift and mean log-ratio
    res = (frame["rate"] - frame["v_pred"]).to_numpy()
    for c in ["drift", "mean_logw"] + [f"snis{a:g}" for a in alphas]:
        x = frame[c].to_numpy() - (frame["record"].to_numpy() if c.startswith("snis") else 0)
        ok = np.isfinite(x)
        print(f"corr(rate - v_pred, {c}{' - record' if c.startswith('snis') else ''}) = "
              f"{np.corrcoef(res[ok], x[ok])[0, 1]:+.3f}")
    slope_report(frame, alphas)


def slope_report(frame: pl.DataFrame, alphas: list[float], splits=(8, 12)) -> None:
    """The stage's slope (unpenalised) fitted on the steps before a split, and the binomial log-loss
    of the later steps' outcomes with and without it: what the shift buys prospectively."""
    s, n = (frame["rate"] * frame["n"]).to_numpy(), frame["n"].to_numpy().astype(float)
    z = _logit(frame["v_pred"].to_numpy().astype(float))
    for a in alphas:
        d = np.clip(_logit(frame[f"snis{a:g}"].to_numpy()) - _logit(frame["record"].to_numpy()), -3.0, 3.0)
        rows = pl.DataFrame({"is_shift": d, "v_unshifted": frame["v_pred"], "n_success": s, "n_total": n})
        for split in splits:
            before = (frame["iteration"] < split).to_numpy()
            beta, _ = fit_slope(rows.filter(pl.Series(before)), HistoryShiftConfig(l2=0.0, min_rows=2))
            p0, p1 = sigmoid(z[~before]), sigmoid(z[~before] + beta * d[~before])
            loss = [float(-(s[~before] * np.log(p) + (n[~before] - s[~before]) * np.log1p(-p)).sum() / n[~before].sum())
                    for p in (np.clip(p0, 1e-6, 1 - 1e-6), np.clip(p1, 1e-6, 1 - 1e-6))]
            print(f"alpha {a:g}: slope on steps < {split}: {beta:+.3f}; log-loss of the later steps "
                  f"{loss[0]:.4f} -> {loss[1]:.4f}")


if __name__ == "__main__":
    main()
