"""Agreement of the project's verifiers with their field's references, per category.

    scripts/fetch-bfcl-eval.sh /tmp/bfcl-eval
    python benchmarks/learning/verifier_agreement.py --bfcl-dir /tmp/bfcl-eval [--seed 0] [--skip-math]

* Function calling: BFCL's own AST checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py`` of
  the unpacked ``bfcl-eval`` wheel) and ``trace_core.envs.fc.check.ast_match`` on the same calls —
  correct ones from the possible answers and perturbed ones (``tests/envs/bfcl_reference.py``) —
  for every task of every AST category BFCL ships data for.
* Math: ``check_math`` and ``math-verify`` on the hand-labelled GSM8K / MATH-style cases of
  ``tests/envs/math_cases.py``: agreement, and each one's accuracy and false positives against
  the labels.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.envs.bfcl_reference import agreement, load_reference, reference_dir  # noqa: E402
from tests.envs.math_cases import CASES, math_verify_accepts  # noqa: E402
from trace_core.envs.fc.bfcl import AST_CATEGORIES  # noqa: E402
from trace_core.envs.math.answers import check_math  # noqa: E402


def bfcl_table(root: Path, seed: int) -> None:
    ref = load_reference(root)
    print(f"BFCL AST checker vs ours ({root})")
    print(f"{'category':24s} {'tasks':>6s} {'cases':>7s} {'agree':>8s} {'both ok':>8s} {'nested ok':>10s}  disagreements")
    tot_cases = tot_agree = 0
    for cat in AST_CATEGORIES:
        t = time.perf_counter()
        r = agreement(ref, root / "bfcl_eval" / "data", cat, seed=seed)
        tot_cases += r.cases
        tot_agree += r.agree
        print(f"{cat:24s} {r.tasks:6d} {r.cases:7d} {r.rate:8.3%} {r.accepted_by_both:8d} "
              f"{r.nested_accepted:>4d}/{r.nested_tasks:<5d}  {dict(r.disagreements) or '-'}"
              f"  ({time.perf_counter() - t:.1f}s)")
    print(f"{'all':24s} {'':6s} {tot_cases:7d} {tot_agree / max(1, tot_cases):8.3%}")


def math_table() -> None:
    print("\nmath: check_math vs math-verify on labelled cases")
    print(f"{'category':28s} {'n':>3s} {'agree':>6s} {'ours acc':>9s} {'m-v acc':>8s} {'FP ours':>8s} {'FP m-v':>7s}")
    tot = [0] * 6
    for cat, cases in CASES.items():
        ours = [check_math(p, g)[0] == 1.0 for g, p, _ in cases]
        mv = [math_verify_accepts(g, p) for g, p, _ in cases]
        lab = [ok for _, _, ok in cases]
        row = [len(cases), sum(a == b for a, b in zip(ours, mv, strict=True)),
               sum(a == b for a, b in zip(ours, lab, strict=True)), sum(a == b for a, b in zip(mv, lab, strict=True)),
               sum(a and not b for a, b in zip(ours, lab, strict=True)),
               sum(a and not b for a, b in zip(mv, lab, strict=True))]
        tot = [a + b for a, b in zip(tot, row, strict=True)]
        n = row[0]
        print(f"{cat:28s} {n:3d} {row[1] / n:6.0%} {row[2] / n:9.0%} {row[3] / n:8.0%} {row[4]:8d} {row[5]:7d}")
    n = tot[0]
    print(f"{'all':28s} {n:3d} {tot[1] / n:6.1%} {tot[2] / n:9.1%} {tot[3] / n:8.1%} {tot[4]:8d} {tot[5]:7d}")
    for pred in ["9**9**9**9", "\\boxed{9^{9^{9^{9}}}}"]:
        t = time.perf_counter()
        check_math(pred, "5")
        ours_s = time.perf_counter() - t
        t = time.perf_counter()
        math_verify_accepts("5", pred)
        print(f"hostile {pred!r}: check_math {ours_s * 1e6:.0f} us, math-verify {time.perf_counter() - t:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bfcl-dir", type=Path, default=None, help="unpacked bfcl-eval wheel (fetch-bfcl-eval.sh)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-math", action="store_true")
    args = ap.parse_args()
    root = args.bfcl_dir or reference_dir()
    if root is None or not (root / "bfcl_eval" / "data" / "possible_answer").is_dir():
        print("BFCL: no unpacked bfcl-eval wheel; run scripts/fetch-bfcl-eval.sh DIR and pass --bfcl-dir DIR")
    else:
        bfcl_table(root, args.seed)
    if not args.skip_math:
        math_table()


if __name__ == "__main__":
    main()
