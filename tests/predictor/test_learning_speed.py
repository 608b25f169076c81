"""Learning speed: after one fit on one iteration's worth of data (or only the held-out evaluation
before training), root predictions rank (family, difficulty) cells of known success rate correctly,
and a cell solved every time is predicted above 0.9."""

import numpy as np
import polars as pl
from scipy.stats import spearmanr

from trace_core.predictor import PredictorConfig, make_predictor
from trace_core.predictor.synthetic import cell_rate_iteration

RATES = {("fc", 0): 1.0, ("math", 0): 0.8, ("fc", 1): 0.6, ("math", 1): 0.4, ("fc", 2): 0.2, ("math", 2): 0.0}


def _cell_predictions(pred, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean root prediction per cell for prompts never seen, and the cells' true rates."""
    roots = cell_rate_iteration(RATES, 1, seed=seed, n_prompts=12, m=1, prompt_offset=1000).filter(pl.col("depth") == 0)
    cells = (roots.select("task", "difficulty").with_columns(pl.Series("p", pred.predict(roots)))
             .group_by("task", "difficulty").agg(pl.col("p").mean()).sort("task", "difficulty"))  # fmt: skip
    truth = np.array([RATES[(t, d)] for t, d in zip(cells["task"], cells["difficulty"], strict=True)])
    return cells["p"].to_numpy(), truth


def test_one_iteration_ranks_the_cells():
    gaps = []
    for seed in range(4):
        one_iteration = cell_rate_iteration(RATES, 0, seed=seed, n_prompts=48, m=4)  # 192 trajectories
        pred = make_predictor(PredictorConfig())
        pred.fit(one_iteration)
        p, truth = _cell_predictions(pred, seed)
        assert spearmanr(truth, p).statistic == 1.0, (seed, p)
        assert p[truth == 1.0][0] > 0.9 and p[truth == 0.0][0] < 0.1
        gaps.append(np.diff(p[np.argsort(truth)]))
    assert np.mean(gaps) > 0.1  # the orders hold with a margin, not by a hair


def test_iteration_zero_is_not_blind_with_a_cell_prior():
    """The held-out evaluation before training (4 prompts x 2 samples per cell) is the cell prior."""
    rng = np.random.default_rng(0)
    cells = pl.DataFrame({"task": [c[0] for c in RATES], "difficulty": [c[1] for c in RATES],
                          "n_success": [int(rng.binomial(8, r)) for r in RATES.values()],
                          "n_total": [8] * len(RATES)})  # fmt: skip
    pred = make_predictor(PredictorConfig())
    report = pred.fit(pl.DataFrame(schema=cell_rate_iteration(RATES, 0, seed=0, n_prompts=1).schema),
                      cell_prior=cells)
    assert report.prior["cell_prior_cells"] == len(RATES)
    p, truth = _cell_predictions(pred, seed=0)
    assert np.unique(p).size == len(RATES) and spearmanr(truth, p).statistic > 0.9
