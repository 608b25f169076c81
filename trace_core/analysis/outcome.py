"""What a finished run's closing lines claim, with how sure they are.

* ``paired_change``: the held-out accuracy change from one evaluation to another of the same run.
  Both score the same held-out prompts with the same sampling seeds (``stages.iteration.evaluate``),
  so the change is a paired difference per prompt: its 95% interval is much tighter than the two
  accuracies' own intervals would suggest (the prompt-to-prompt spread cancels).
* ``uniform_effective_ratio``: what uniform GRPO (groups of ``group_size``, the first
  budget / group_size candidates of each pool, as the uniform strategies take the stream) would
  have had on the run's own candidates, expected under the predictor's success probabilities.
  ``V_root(v, m)`` is concave in ``v``, so for calibrated predictions this is an upper bound on
  GRPO's true expected effective ratio (Jensen): the comparison never flatters the run.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from trace_core.home.layout import shard_path
from trace_core.home.shards import read_shard
from trace_core.stages.results import Evaluation
from trace_core.stages.run import RunRef
from trace_core.utility import root_utility


def paired_change(before: Evaluation, after: Evaluation) -> tuple[float, float, int] | None:
    """(mean change, 95% t half-width, prompts) of ``after`` - ``before`` per held-out prompt;
    None without two comparable evaluations (off, or a different prompt set)."""
    a, b = np.asarray(before.per_prompt, dtype=float), np.asarray(after.per_prompt, dtype=float)
    if len(a) < 2 or len(a) != len(b):
        return None
    d = b - a
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return float(d.mean()), half, len(d)


def uniform_effective_ratio(ref: RunRef, iterations: list[dict], group_size: int) -> float | None:
    """Expected effective ratio of uniform GRPO on the run's candidate pools (one per iteration
    row, its ``budget_asked`` trajectories), under the predicted success probabilities."""
    ratios = []
    for row in iterations:
        path = shard_path(ref.home, "prompts", ref.run_id, "final", int(row["iteration"]))
        n = int(row.get("budget_asked") or 0) // max(group_size, 1)
        if not path.is_file() or n == 0:
            continue
        v = read_shard(path)["v_pred"].to_numpy()[:n].astype(float)
        ratios.append(float(np.mean(root_utility(v, group_size))))
    return float(np.mean(ratios)) if ratios else None
