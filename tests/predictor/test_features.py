"""Featurisation: shapes, determinism, path text from ancestors vs a path_text column."""

import numpy as np
import polars as pl

from trace_core.predictor.config import FeatureConfig
from trace_core.predictor.features import DENSE_NAMES, featurize


def _dense_text(fb, n_buckets):
    out = np.zeros((fb.n, n_buckets))
    ends = np.append(fb.offsets[1:], len(fb.idx))
    for i, (a, b) in enumerate(zip(fb.offsets, ends, strict=True)):
        np.add.at(out[i], fb.idx[a:b], fb.vals[a:b])
    return out


def test_shapes_and_determinism(small_run):
    cfg = FeatureConfig(hash_bits=12)
    frame = small_run.head(200)
    fb = featurize(frame, cfg)
    assert fb.n == 200 and fb.dense.shape == (200, len(DENSE_NAMES)) and fb.dense.dtype == np.float32
    assert fb.idx.min() >= 0 and fb.idx.max() < 2**12 and len(fb.idx) == len(fb.vals)
    again = featurize(frame, cfg)
    np.testing.assert_array_equal(fb.idx, again.idx)
    sub = fb.take(np.array([5, 1]))
    np.testing.assert_array_equal(_dense_text(sub, 2**12), _dense_text(fb, 2**12)[[5, 1]])


def test_prefix_sees_its_path_and_question(small_run):
    cfg = FeatureConfig(hash_bits=14)
    deep = small_run.filter(pl.col("depth") == 2).head(1)
    pid = deep["prompt_id"][0]
    alone = featurize(deep, cfg)  # ancestors absent: only its own turn
    with_tree = featurize(small_run.filter(pl.col("prompt_id") == pid), cfg)
    row = small_run.filter(pl.col("prompt_id") == pid)["node_id"].to_list().index(deep["node_id"][0])
    n_alone = alone.offsets[-1] if alone.n > 1 else len(alone.idx)
    ends = np.append(with_tree.offsets[1:], len(with_tree.idx))
    assert ends[row] - with_tree.offsets[row] > n_alone  # question + path add features
    # an explicit path_text (+ question column) stands in for the ancestors
    with_path = deep.with_columns(pl.lit("<tool_call>search</tool_call> result: city").alias("path_text"))
    with_both = with_path.with_columns(pl.lit("Who is the author of the album?").alias("question"))
    a, b = featurize(with_path, cfg), featurize(with_both, cfg)
    assert not np.array_equal(a.idx, alone.idx) and len(b.idx) > len(a.idx)
