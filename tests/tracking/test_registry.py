"""The run's datasets and final policy in MLflow (sqlite backend in a temporary directory)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from trace_core.config import TrainConfig
from trace_core.config.io import dump_yaml
from trace_core.config.tracking import TrackingConfig
from trace_core.policy.config import TINY_WARM_DIR
from tracking.mlflow_tracker import Tracker
from tracking.registry import dataset_records, model_files

SAMPLES = str(Path(__file__).resolve().parents[2] / "trace_core" / "data" / "samples")


def _cfg() -> TrainConfig:
    return TrainConfig.model_validate({"data": {
        "train": [{"path": f"{SAMPLES}/gsm8k_64.jsonl", "loader": "gsm8k", "weight": 2.0},
                  {"path": f"{SAMPLES}/musique.jsonl", "loader": "musique"}],
        "heldout": [{"path": f"{SAMPLES}/gsm8k.jsonl", "loader": "gsm8k", "name": "gsm8k-test"}]}})


@pytest.fixture
def client(tmp_path, monkeypatch, template_db):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)  # a sqlite URI's default artifact root is ./mlruns
    from mlflow import MlflowClient

    shutil.copy(template_db, tmp_path / "mlflow.db")  # migrated once (tests/tracking/conftest.py)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return uri, MlflowClient(tracking_uri=uri)


def test_datasets_logged_as_run_inputs_with_digests(tmp_path, client):
    uri, mlc = client
    records = dataset_records(_cfg())
    assert [(r["name"], r["context"], r["rows"]) for r in records] == \
        [("gsm8k_64", "training", 64), ("musique", "training", 2), ("gsm8k-test", "evaluation", 5)]
    tr = Tracker(tmp_path, "r1", config=TrackingConfig(tracking_uri=uri))
    tr.log_inputs(records)
    assert tr.finish(timeout=180), tr.last_error
    inputs = mlc.get_run(tr.mlflow_run_id).inputs.dataset_inputs
    got = {(d.dataset.name, d.dataset.digest, {t.key: t.value for t in d.tags}["mlflow.data.context"]) for d in inputs}
    assert got == {(r["name"], r["digest"], r["context"]) for r in records}
    assert all(len(r["digest"]) == 16 for r in records)
    # the digest is the content's: a copy of the file has the same digest, an edited row changes it
    text = (Path(SAMPLES) / "gsm8k_64.jsonl").read_text()
    for sub, body, same in (("copy", text, True), ("edit", text.replace("#### 6\"", "#### 7\"", 1), False)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "gsm8k_64.jsonl").write_text(body)
        cfg = _cfg()
        cfg.data.train[0].path = str(tmp_path / sub / "gsm8k_64.jsonl")
        assert (dataset_records(cfg)[0]["digest"] == records[0]["digest"]) is same


def test_final_policy_logged_registered_and_loadable(tmp_path, client):
    uri, mlc = client
    staged = model_files(TINY_WARM_DIR, tmp_path / "checkpoint")  # the name it keeps in the model
    assert (staged / "model.safetensors").is_file() and (staged / "tokenizer.json").is_file()
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(dump_yaml(TrainConfig()))
    tr = Tracker(tmp_path, "r2", config=TrackingConfig(tracking_uri=uri))
    tr.log_model(staged, cfg_path, registered_model_name="tiny-policy", source=str(TINY_WARM_DIR))
    assert tr.finish(timeout=180) and tr.healthy, tr.last_error
    versions = mlc.search_model_versions("name='tiny-policy'")
    assert len(versions) == 1 and versions[0].run_id == tr.mlflow_run_id
    import mlflow

    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/tiny-policy/1")
    out = model.predict(["What is 3 + 4?"], params={"max_new_tokens": 24})
    assert len(out) == 1 and isinstance(out[0], str) and out[0]
    from transformers import AutoConfig

    local = mlflow.artifacts.download_artifacts("models:/tiny-policy/1", dst_path=str(tmp_path / "dl"))
    local = os.path.join(local, "artifacts", "checkpoint")
    assert AutoConfig.from_pretrained(local, local_files_only=True).model_type == "qwen3"
    assert not [f for f in os.listdir(local) if "optimizer" in f or f.endswith(".pt")]


def test_staging_refuses_a_directory_without_a_model(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        model_files(tmp_path / "empty", tmp_path / "out")
