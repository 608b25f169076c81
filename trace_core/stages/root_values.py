"""What a candidate prompt is worth to the root plan: the predictor's posterior behind each ``v``.

``root_concentration`` asks the predictor for the pseudo-trajectories behind each root prediction;
``root_values`` records what the plan valued (``V_root(v, m)``, or its expectation under the
posterior when the strategy's ``root_posterior`` is on); ``stored_concentration`` reads stage 2's
record back for the second root wave. ``planned_v`` is what the plan is made on: the mean, or with
the strategy's ``root_thompson`` one seeded draw per candidate from its posterior (stage 4 redraws
the same values from the stored shard).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trace_core.config import TrainConfig
from trace_core.stages.run import iteration_seed
from trace_core.utility import expected_root_value_columns, root_utility


def root_concentration(pred, rows: pl.DataFrame) -> np.ndarray | None:
    """Pseudo-trajectories behind each root prediction (the predictor's posterior), or None where
    the predictor has none (``predict_concentration`` absent or not fitted yet)."""
    fn = getattr(pred, "predict_concentration", None)
    c = fn(rows) if fn is not None else None
    return None if c is None else np.asarray(c, dtype=np.float64)


def _knob(cfg: TrainConfig, name: str) -> bool:
    return bool(getattr(cfg.allocation.knobs(cfg.allocation.strategy), name, False))


def planned_v(cfg: TrainConfig, iteration: int, v: np.ndarray, conc: np.ndarray | None) -> np.ndarray:
    """The success rates the root plan uses: ``v`` itself, or with ``root_thompson`` one draw per
    candidate from Beta(c v, c (1 - v)), clipped like predictions. Inputs are taken at the
    precision the prompts shard stores (float32), so stage 4 redraws exactly what stage 2 drew."""
    if conc is None or not _knob(cfg, "root_thompson") or len(v) == 0:
        return np.asarray(v, dtype=np.float64)
    v = np.asarray(v, dtype=np.float32).astype(np.float64)
    c = np.maximum(np.asarray(conc, dtype=np.float32).astype(np.float64), 1e-6)
    lo = cfg.allocation.min_prob
    a, b = np.maximum(c * v, 1e-6), np.maximum(c * (1.0 - v), 1e-6)
    draws = np.random.default_rng(iteration_seed(cfg, iteration, "thompson")).beta(a, b)
    return np.clip(np.nan_to_num(draws, nan=0.5), lo, 1.0 - lo)


def root_values(cfg: TrainConfig, v: np.ndarray, conc: np.ndarray | None, m: np.ndarray) -> np.ndarray:
    """``V_root(v, m)`` per candidate, or its expectation under the posterior the plan used."""
    if conc is None or not _knob(cfg, "root_posterior") or len(v) == 0:
        return root_utility(v, m)
    table = expected_root_value_columns(v, conc, int(max(m.max(), 2)))
    return table[np.asarray(m, dtype=np.int64), np.arange(len(v))]


def stored_concentration(prompts: pl.DataFrame) -> np.ndarray | None:
    """The concentrations stage 2 recorded in the prompts shard (None where any is missing)."""
    if "v_concentration" not in prompts.columns:
        return None
    c = prompts["v_concentration"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    return None if np.isnan(c).any() else c
