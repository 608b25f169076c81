"""What each row's root plan picks, per family: how many prompts, how often the same ones, at what rate.

Two rows can hold as many contrastive prompts a step and still teach the model differently; this
prints, from the ``prompts`` view (one row per candidate per step), the shape of their choices, so
an oracle row can be set beside a predicted one:

    PYTHONPATH=. python benchmarks/learning/pick_profile.py --home H \\
        --row oracle='e192-d1-trace-rootoracle4-s%' --row reference='e192-d1-trace-reference-s%'

Per family, averaged over the runs of the row and the steps from ``--first`` on:

* ``picked``: prompts with a raw rollout a step; ``m``: raw rollouts per picked prompt;
* ``contr.``: picked prompts whose raw group held both outcomes, a step, and their share;
* ``rate``: the mean success rate of the picked groups; ``p(pick)``: the mean predicted rate
  (``v_pred``; an oracle row's is the rate of its uncounted fresh episodes);
* ``new``: share of picks never sampled at an earlier step; ``again``: share picked the step
  before too; ``distinct``: prompts of the family sampled at least once in the run;
* ``d̄ contr.``: mean difficulty of the contrastive picks; ``rate bins``: the picked groups by
  success rate (0 | (0, 1/3] | (1/3, 2/3) | [2/3, 1) | 1), as shares.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import duckdb

_PATTERN = re.compile(r"^[A-Za-z0-9_.%-]+$")

QUERY = """
with p as (select run_id, iteration, prompt_id, task, difficulty, v_pred, m_alloc, n_success, n_total
           from prompts where run_id like $runs and iteration >= 0),
     picked as (select *, n_success::double / n_total rate,
                       (n_success > 0 and n_success < n_total) contrastive
                from p where n_total > 0),
     marks as (select *,
                      lag(iteration) over w = iteration - 1 again,
                      row_number() over w = 1 new
               from picked window w as (partition by run_id, prompt_id order by iteration)),
     steps as (select count(distinct (run_id, iteration)) n from marks where iteration >= $first),
     distinct_prompts as (select task, count(distinct (run_id, prompt_id)) / count(distinct run_id) d
                          from marks group by all)
select m.task, count(distinct m.run_id) runs,
       count(*) / any_value(steps.n) picked,
       avg(n_total) m,
       count(*) filter (contrastive) / any_value(steps.n) contr,
       avg(contrastive::int) contr_share,
       avg(rate) rate, avg(v_pred) p_pick,
       avg(new::int) new, avg(coalesce(again, false)::int) again,
       any_value(dp.d) distinct_n,
       avg(difficulty) filter (contrastive) d_contr,
       avg((rate = 0)::int) b0, avg((rate > 0 and rate <= 1/3)::int) b1,
       avg((rate > 1/3 and rate < 2/3)::int) b2, avg((rate >= 2/3 and rate < 1)::int) b3,
       avg((rate = 1)::int) b4
from marks m cross join steps join distinct_prompts dp on m.task = dp.task
where m.iteration >= $first
group by m.task order by m.task
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True, help="Run home holding trace.duckdb.")
    ap.add_argument("--row", action="append", required=True, metavar="NAME=PATTERN",
                    help="A row: its name and the SQL LIKE pattern of its child run ids (repeatable).")
    ap.add_argument("--first", type=int, default=0, help="First step counted (default 0).")
    args = ap.parse_args()
    rows = []
    for spec in args.row:
        name, sep, pattern = spec.partition("=")
        if not sep or not name or not _PATTERN.match(pattern):
            raise SystemExit(f"--row {spec!r}: NAME=PATTERN, the pattern of letters, digits, '-', '_', '.', '%' only")
        rows.append((name, pattern))
    db = args.home / "trace.duckdb"
    if not db.is_file():
        raise SystemExit(f"--home {args.home}: no trace.duckdb there")
    con = duckdb.connect(str(db), read_only=True)
    print("| row | family | runs | picked | m | contr. | share | rate | p(pick) | new | again | distinct"
          " | d̄ contr. | rate bins |")
    print("|---" * 14 + "|")
    for name, pattern in rows:
        found = con.execute(QUERY, {"runs": pattern, "first": args.first}).fetchall()
        if not found:
            raise SystemExit(f"--row {name}: no picked prompt matches {pattern!r}")
        for (task, runs, picked, m, contr, share, rate, p_pick, new, again, distinct_n, d_contr,
             *bins) in found:
            f = (lambda x, d=2: "–" if x is None else f"{x:.{d}f}")  # noqa: E731
            print(f"| {name} | {task} | {runs} | {picked:.1f} | {m:.2f} | {contr:.1f} | {share:.0%} | {f(rate)}"
                  f" | {f(p_pick)} | {new:.0%} | {again:.0%} | {distinct_n:.0f} | {f(d_contr)}"
                  f" | {' / '.join(f'{b:.0%}' for b in bins)} |")


if __name__ == "__main__":
    main()
