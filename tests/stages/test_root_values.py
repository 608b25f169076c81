"""What the root plan is made on: the predicted mean, or with ``allocation.trace.root_thompson``
one seeded draw per candidate from its Beta posterior (stage 4 redraws the same values)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from trace_core.config import TrainConfig
from trace_core.stages.root_values import planned_v


def _cfg(seed: int = 1, **knobs) -> TrainConfig:
    cfg = TrainConfig()
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": seed})})
    alloc = cfg.allocation.model_copy(update={"strategy": "trace"})
    if knobs:
        alloc = alloc.with_knobs("trace", **knobs)
    return cfg.model_copy(update={"allocation": alloc})


V = np.array([0.05, 0.5, 0.5, 0.93, 0.98], dtype=np.float64)
C = np.array([1.0, 2.0, 400.0, 30.0, 3.0])


def test_off_or_without_a_posterior_the_plan_uses_the_mean():
    assert np.array_equal(planned_v(_cfg(), 3, V, C), V)
    assert np.array_equal(planned_v(_cfg(root_thompson=True), 3, V, None), V)


def test_thompson_draws_are_seeded_per_run_and_iteration_and_follow_the_posterior():
    on = _cfg(root_thompson=True)
    a, b = planned_v(on, 3, V, C), planned_v(on, 3, V, C)
    assert np.array_equal(a, b)  # stage 4 redraws what stage 2 drew
    assert not np.array_equal(a, planned_v(on, 4, V, C))
    assert not np.array_equal(a, planned_v(_cfg(seed=2, root_thompson=True), 3, V, C))
    lo = on.allocation.min_prob
    assert np.all((a >= lo) & (a <= 1 - lo))
    # what the shard stores (float32 v and concentration) redraws bit for bit
    assert np.array_equal(a, planned_v(on, 3, V.astype(np.float32), C.astype(np.float32)))
    # over iterations each candidate's draws average its mean; a long record keeps them close to it
    draws = np.stack([planned_v(on, i, V, C) for i in range(4000)])
    assert np.allclose(draws.mean(0), np.clip(V, lo, 1 - lo), atol=0.03)
    assert draws[:, 2].std() < 0.03 < draws[:, 1].std()


def test_thompson_and_posterior_values_are_exclusive():
    with pytest.raises(ValidationError, match="exclusive"):
        _cfg(root_thompson=True, root_posterior=True)
