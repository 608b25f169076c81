"""save / load_predictor: a safetensors file, same predictions; pickles are refused, never loaded."""

import pickle

import numpy as np
import polars as pl
import pytest
import torch

from trace_core.predictor import load_predictor, make_predictor


class _Trap:
    """Unpickling this would create the file named in ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_round_trip_gives_the_same_predictions_and_warm_starts(small_run, fast_config, tmp_path):
    pred = make_predictor(fast_config)
    pred.fit(small_run.filter(pl.col("iteration") < 2))
    path = pred.save(tmp_path / "predictor.safetensors")
    again = load_predictor(path)
    test = small_run.filter(pl.col("iteration") == 2)
    np.testing.assert_allclose(again.predict(test), pred.predict(test))
    r = test.join(test.filter(pl.col("is_leaf")).select("trajectory_id", pl.col("reward").alias("r")),
                  on="trajectory_id", how="left").with_columns(pl.col("r").fill_null(0.0))  # fmt: skip
    np.testing.assert_allclose(again.predict_flip(r), pred.predict_flip(r))
    assert again.fit(small_run).warm_start  # the loaded head is the next fit's start
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_unfitted_and_logistic_predictors_round_trip(small_run, fast_config, tmp_path):
    fresh = make_predictor(fast_config)
    assert np.all(load_predictor(fresh.save(tmp_path / "a.st")).predict(small_run) == 0.5)
    logi = make_predictor(fast_config.model_copy(update={"name": "hashed_logistic"}))
    logi.fit(small_run)
    np.testing.assert_allclose(load_predictor(logi.save(tmp_path / "b.st")).predict(small_run), logi.predict(small_run))


@pytest.mark.parametrize("writer", ["torch", "pickle"])
def test_pickled_files_are_refused_without_unpickling(tmp_path, writer):
    trap, path = tmp_path / "trap-fired", tmp_path / "predictor.pt"
    if writer == "torch":
        torch.save(_Trap(trap), path)  # what the old flow wrote: a zip archive holding a pickle
    else:
        path.write_bytes(pickle.dumps(_Trap(trap)))
    with pytest.raises(ValueError, match="pickled predictor") as err:
        load_predictor(path)
    assert "\n" not in str(err.value) and not trap.exists()


def test_other_files_are_refused(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello world, not a predictor")
    with pytest.raises(ValueError, match="not a saved predictor"):
        load_predictor(junk)
