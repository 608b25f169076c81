"""Root predictions against the oracle's sampled success rates, per family and kind (unseen, seen).

An oracle run (``trace@rootoracle4``) records, for every candidate prompt of every step, the
success rate of 4 fresh episodes under its current policy (``prompts.v_pred``). A TRACE run of the
same run seed starts from the same checkpoint and scores the same candidates, so pairing the two
by (child seed, iteration, prompt) says how far its predictions are from the current rates -- for
every candidate, not only the ones it picked -- while the two policies stay close (early steps
weigh most; later ones drift apart, so read the figures as an upper bound on the error):

    PYTHONPATH=. python benchmarks/learning/oracle_gap.py --home H \\
        --runs 'e192-s6b-trace-s%' --oracle 'e192-s6b-trace-rootoracle4-s%'

A root is *seen* when its prompt was sampled (any trajectory) at an earlier step of the TRACE run.
``cell`` is the oracle's mean rate of the other prompts of the (family, difficulty) cell at that
step and seed: what a predictor that knew only the cell's current rate would say. ``bias`` is the
mean prediction minus the mean rate. The correlations pool steps and seeds: a prediction that
follows the cell's rate from step to step scores there too.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import duckdb

_PATTERN = re.compile(r"^[A-Za-z0-9_.%-]+$")

QUERY = """
with t as (select run_id, regexp_extract(run_id, '-s([0-9]+)$', 1) seed, iteration, prompt_id, task, difficulty,
                  v_pred, m_alloc
           from prompts where run_id like $runs and run_id not like '%oracle%'),
     o as (select regexp_extract(run_id, '-s([0-9]+)$', 1) seed, iteration, prompt_id, v_pred rate
           from prompts where run_id like $oracle),
     firsts as (select run_id, prompt_id, min(iteration) first_sampled from trajectories
                where run_id like $runs and run_id not like '%oracle%' group by all),
     j as (select t.*, o.rate, coalesce(t.iteration > firsts.first_sampled, false) seen,
                  (sum(o.rate) over c - o.rate) / nullif(count(*) over c - 1, 0) cell
           from t join o using (seed, iteration, prompt_id) left join firsts using (run_id, prompt_id)
           where t.iteration >= 1 and t.iteration <= $last
           window c as (partition by t.seed, t.iteration, t.task, t.difficulty))
select task, case when seen then 'seen' else 'unseen' end kind, count(*) n, count(distinct seed) seeds,
       corr(v_pred, rate) corr_pred, corr(cell, rate) corr_cell,
       avg((v_pred - rate) ^ 2) mse_pred, avg((cell - rate) ^ 2) mse_cell, avg(v_pred - rate) bias,
       avg(rate) mean_rate
from j group by all order by task, kind
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True, help="Run home holding trace.duckdb.")
    ap.add_argument("--runs", required=True, help="SQL LIKE pattern of the TRACE child run ids.")
    ap.add_argument("--oracle", required=True, help="SQL LIKE pattern of the oracle child run ids (same seeds).")
    ap.add_argument("--last", type=int, default=10_000, help="Last iteration compared (the policies drift apart).")
    args = ap.parse_args()
    for name in ("runs", "oracle"):
        if not _PATTERN.match(getattr(args, name)):
            raise SystemExit(f"--{name}: a run-id pattern of letters, digits, '-', '_', '.', '%' only")
    db = args.home / "trace.duckdb"
    if not db.is_file():
        raise SystemExit(f"--home {args.home}: no trace.duckdb there")
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(QUERY, {"runs": args.runs, "oracle": args.oracle, "last": args.last}).fetchall()
    if not rows:
        raise SystemExit("no candidate is in both: check the patterns (the same child seeds, e.g. -s0 .. -s4)")
    print("| family | kind | candidates | seeds | corr(pred, rate) | corr(cell, rate) | MSE pred | MSE cell | bias | mean rate |")
    print("|---" * 10 + "|")
    for task, kind, n, seeds, cp, cc, mp, mc, bias, rate in rows:
        f = (lambda x, d=3: "–" if x is None else f"{x:.{d}f}")  # noqa: E731
        print(f"| {task} | {kind} | {n} | {seeds} | {f(cp)} | {f(cc)} | {f(mp, 4)} | {f(mc, 4)} | {f(bias):>6} | {f(rate, 2)} |")


if __name__ == "__main__":
    main()
