"""Root predictions of several predictor settings, replayed prospectively on one run's nodes, per
task family: for t = 1..N each setting is fitted on the nodes of iterations < t (saved and reloaded
as the flow hands it on) and predicts iteration t's sampled roots before their outcomes are looked
at. Ranking *within* a family is what selection needs (``allocation.stratify`` fixes the shares).

    PYTHONPATH=. python benchmarks/learning/predictor_replay.py --home H --run-id e192-t-trace-s0 \\
        --iterations 19 --setting default='{}' --setting refine='{"model": {"refine_roots": true}}'

A second table splits the roots by kind: *unseen* (the prompt's first visit: predicted from its
cell) and *seen* (from its own record), with the mean bias of each.

A setting is NAME=JSON, a ``PredictorConfig`` (``predictor:`` of a config file). No cell prior is
handed to the fits (the flow passes the held-out evaluation before training), so iteration 1 is
the first predicted.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polars as pl

from benchmarks.learning.predictor_goal import eval_mask, load_run
from trace_core.predictor import PredictorConfig, load_predictor, make_predictor
from trace_core.predictor.base import decision_labels
from trace_core.predictor.evaluation import auc, brier
from trace_core.predictor.prior import outcome_counts


def replay(nodes: pl.DataFrame, cfg: PredictorConfig, iterations: int, tmp: Path) -> pl.DataFrame:
    """One row per predicted root: iteration, family, prediction, outcome rate and weight."""
    pred, parts = make_predictor(cfg), []
    tmp.mkdir(parents=True, exist_ok=True)
    for t in range(1, iterations + 1):
        frame = nodes.filter(pl.col("iteration") == t)
        if frame.height == 0:
            break
        pred.fit(nodes.filter(pl.col("iteration") < t))
        pred = load_predictor(pred.save(tmp / f"predictor-{t}.safetensors"))
        m = eval_mask(frame) & (frame["depth"].fill_null(0).to_numpy() == 0)
        roots = frame.filter(pl.Series(m))
        y, w = decision_labels(roots, outcome_counts(frame))
        before = nodes.filter(pl.col("iteration") < t)["prompt_id"].unique().implode()
        parts.append(pl.DataFrame({"iteration": t, "task": roots["task"], "p": pred.predict(frame)[m], "y": y, "w": w,
                                   "seen": roots["prompt_id"].is_in(before)}))
    return pl.concat(parts) if parts else pl.DataFrame()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--iterations", type=int, default=19)
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=JSON")
    args = ap.parse_args()
    settings = {}
    for spec in args.setting or ["default={}"]:
        name, sep, text = spec.partition("=")
        if not sep:
            raise SystemExit(f"--setting {spec!r}: expected NAME=JSON")
        try:
            settings[name] = PredictorConfig.model_validate(json.loads(text))
        except (ValueError, json.JSONDecodeError) as err:
            raise SystemExit(f"--setting {name}: {' '.join(str(err).split())[:300]}") from None
    nodes = load_run(args.home, args.run_id)
    tmp = Path(tempfile.mkdtemp(prefix="predictor_replay_"))
    print("| setting | seconds | roots | AUC | Brier | " + " | ".join(f"{f} AUC | {f} Brier" for f in ("math", "qa", "fc")) + " |")
    print("|---" * 11 + "|")
    kinds: dict[str, pl.DataFrame] = {}
    for name, cfg in settings.items():
        t0 = time.perf_counter()
        rows = replay(nodes, cfg, args.iterations, tmp / name)
        p, y, w, fam = (rows[c].to_numpy() for c in ("p", "y", "w", "task"))
        cells = [name, f"{time.perf_counter() - t0:.0f}", str(rows.height), f"{auc(p, y, w):.3f}", f"{brier(p, y, w):.4f}"]
        for f in ("math", "qa", "fc"):
            s = fam == f
            cells += [f"{auc(p[s], y[s], w[s]):.3f}", f"{brier(p[s], y[s], w[s]):.4f}"] if s.any() else ["–", "–"]
        print("| " + " | ".join(cells) + " |", flush=True)
        kinds[name] = rows
    print("\nBy kind (a root is *seen* when its prompt was sampled before; bias = mean prediction - mean outcome):\n")
    print("| setting | kind | roots | AUC | Brier | bias | qa roots | qa AUC | qa Brier | qa bias |")
    print("|---" * 10 + "|")
    for name, rows in kinds.items():
        for kind, sel in (("unseen", ~rows["seen"]), ("seen", rows["seen"])):
            part = rows.filter(sel)
            cells = [name, kind]
            for sub in (part, part.filter(pl.col("task") == "qa")):
                p, y, w = (sub[c].to_numpy() for c in ("p", "y", "w"))
                cells += [str(sub.height)] + ([f"{auc(p, y, w):.3f}", f"{brier(p, y, w):.4f}",
                                               f"{float(((p - y) * w).sum() / w.sum()):+.3f}"] if sub.height else ["–"] * 3)
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
