import polars as pl
import pytest

from trace_core.predictor import PredictorConfig
from trace_core.predictor.synthetic import synthetic_run


@pytest.fixture(scope="session")
def small_run() -> pl.DataFrame:
    """Three iterations of small SYNTHETIC trees (~700 nodes), with continuations."""
    return synthetic_run(3, seed=1, n_prompts=60, prompts_per_iter=24)


@pytest.fixture
def fast_config() -> PredictorConfig:
    return PredictorConfig.model_validate({"model": {"min_steps": 40, "warm_steps": 20, "epochs": 1.0,
                                                     "min_fit_nodes": 10}})  # fmt: skip
