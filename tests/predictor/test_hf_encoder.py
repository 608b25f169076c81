"""The optional encoder predictor behind the same protocol.

The CPU test builds a tiny random BERT and a word-level vocabulary in a temp dir (no hub); the
GPU test uses a real local encoder named by TRACE_HF_ENCODER_PATH and is skipped without one.
"""

import os

import numpy as np
import polars as pl
import pytest

from trace_core.predictor import PredictorConfig, make_predictor

transformers = pytest.importorskip("transformers", reason="transformers not installed")


def _tiny_bert(path) -> str:
    words = "compute using the calculator who is of search call booking tool with answer result error".split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *list('0123456789<>{}":,/=_?.*+-')]
    (path / "vocab.txt").write_text("\n".join(vocab))
    tok = transformers.BertTokenizerFast(vocab_file=str(path / "vocab.txt"))
    tok.save_pretrained(path)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32)  # fmt: skip
    transformers.BertModel(cfg).save_pretrained(path)
    return str(path)


def _check(cfg, small_run):
    pred = make_predictor(cfg)
    pred.fit(small_run.filter(pl.col("iteration") < 2))
    p = pred.predict(small_run.filter(pl.col("iteration") == 2))
    assert p.shape == (small_run.filter(pl.col("iteration") == 2).height,)
    assert np.all((p >= 0) & (p <= 1))


def test_hf_encoder_cpu_tiny_random_bert(tmp_path, small_run):
    path = _tiny_bert(tmp_path)
    cfg = PredictorConfig(name="hf_encoder", encoder_path=path, encoder_device="cpu",
                          model={"epochs": 1, "min_fit_nodes": 10})  # fmt: skip
    _check(cfg, small_run)


def test_hf_encoder_requires_path():
    with pytest.raises(ValueError, match="encoder_path"):
        make_predictor(PredictorConfig(name="hf_encoder"))


@pytest.mark.gpu
def test_hf_encoder_gpu_local_model(small_run):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    path = os.environ.get("TRACE_HF_ENCODER_PATH")
    if not path or not os.path.isdir(path):
        pytest.skip("set TRACE_HF_ENCODER_PATH to a local Hugging Face encoder directory")
    _check(PredictorConfig(name="hf_encoder", encoder_path=path, encoder_device="cuda"), small_run)


def test_hf_encoder_on_cuda_without_a_gpu_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the default device works")
    pred = make_predictor(PredictorConfig(name="hf_encoder", encoder_path=_tiny_bert(tmp_path)))
    with pytest.raises(ValueError, match="no CUDA device here") as err:
        pred.embed(["what is 2 + 2"])
    assert "\n" not in str(err.value)
