"""The run's datasets and its final policy in MLflow.

* **Datasets**: every training and held-out file of the ``data`` section becomes an MLflow
  dataset input of the run (``MlflowClient.log_inputs``: a ``MetaDataset`` over the local file,
  with the content digest of the tasks read from it, context ``training`` / ``evaluation``).
* **Model**: the final checkpoint's weights, tokenizer and the run's config are logged as a
  pyfunc model defined from code (``tracking/policy_model.py``; nothing is pickled) and, with
  ``tracking.registered_model_name``, registered under that name in the model registry.
  ``mlflow.pyfunc.load_model(uri).predict(["What is 3 + 4?"])`` returns the policy's first action
  (greedy) for each question; the checkpoint is also a plain ``save_pretrained`` directory under
  the model's ``artifacts/checkpoint``.

Both are records of the outage-tolerant ``Tracker`` (sent in order by its thread, kept across an
outage), built here as JSON and sent by the functions below.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from trace_core.config import TrainConfig
from trace_core.envs.datasets import dataset_digest, loaded, resolve

MODEL_CODE = Path(__file__).resolve().parent / "policy_model.py"
#: Files of a checkpoint the logged model keeps: weights, model and tokenizer config (not the
#: optimizer state a resumable checkpoint also holds).
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
               "tokenizer*", "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt",
               "added_tokens.json")
PIP_REQUIREMENTS = ["trace-rl", "torch", "transformers", "safetensors"]


def dataset_records(cfg: TrainConfig) -> list[dict[str, Any]]:
    """One JSON record per data file (name, local path, loader, context, digest, rows)."""
    if not cfg.data.enabled:
        return []

    data = loaded(cfg.data)
    out = []
    for entry, part in zip(cfg.data.train, data.train, strict=True):
        out.append({"name": entry.label, "source": str(resolve(entry.path).resolve()), "loader": entry.loader,
                    "context": "training", "digest": dataset_digest(part), "rows": len(part)})
    held = cfg.data.heldout or [e.model_copy(update={"name": f"{e.label}-heldout"}) for e in cfg.data.train]
    for entry in held:
        prefix = (entry.name if cfg.data.heldout else entry.name.removesuffix("-heldout")) or entry.label
        part = [t for t in data.heldout if t.prompt_id.startswith(f"{prefix}:")]
        if part:
            out.append({"name": entry.label, "source": str(resolve(entry.path).resolve()), "loader": entry.loader,
                        "context": "evaluation", "digest": dataset_digest(part), "rows": len(part)})
    return out


def send_datasets(client: Any, run_id: str, records: list[dict[str, Any]]) -> None:
    """``log_inputs`` of the records (a ``MetaDataset`` each, its digest the tasks' content hash)."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.types import ColSpec, Schema

    schema = Schema([ColSpec("string", "prompt_id"), ColSpec("string", "family"), ColSpec("long", "difficulty"),
                     ColSpec("string", "question")])
    inputs = []
    for r in records:
        with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local file
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(r["source"])
        ds = MetaDataset(source, name=r["name"], digest=r["digest"], schema=schema)
        inputs.append(DatasetInput(ds._to_mlflow_entity(), tags=[
            InputTag("mlflow.data.context", r["context"]), InputTag("trace_rl.loader", r["loader"]),
            InputTag("trace_rl.rows", str(r["rows"]))]))
    client.log_inputs(run_id, datasets=inputs)


def model_files(checkpoint: str | Path, out: Path) -> Path:
    """``out`` (name it ``checkpoint``: the model keeps the directory's name) holding the checkpoint's weight, config and tokenizer files (hard links where the
    file system allows, copies otherwise); the optimizer state is left out."""
    src = Path(checkpoint)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for pattern in MODEL_FILES:
        for f in sorted(src.glob(pattern)):
            if f.is_file():
                try:
                    os.link(f, out / f.name)
                except OSError:
                    shutil.copy2(f, out / f.name)
    if not (out / "config.json").is_file():
        raise FileNotFoundError(f"{src} holds no config.json: not a model checkpoint")
    return out


def send_model(client: Any, tracking_uri: str, run_id: str, op: dict[str, Any]) -> str:
    """Log the staged checkpoint and config as the run's pyfunc model ``policy`` (and register it
    when ``op["registered_model_name"]`` is set); returns the model URI.

    Exactly once per MLflow run, whatever stopped an earlier attempt: a finished ``policy`` of
    this run is reused (a re-run of a finished run id, a replayed record), an unfinished one (a
    kill while its files were uploaded) is deleted and logged again, and a registered version
    of this run is never registered twice."""
    import mlflow
    from mlflow.models import infer_signature

    name = op.get("registered_model_name")
    ready = None
    for model in _run_models(client, run_id):
        if str(model.status) == "READY" and ready is None:
            ready = model
        else:  # left unfinished by a killed attempt (or a duplicate of an older version)
            client.delete_logged_model(model.model_id)
    if ready is not None:
        uri = f"models:/{ready.model_id}"
    else:
        signature = infer_signature(["What is 3 + 4?"], ["<answer>7</answer>"], params={"max_new_tokens": 64})
        mlflow.set_tracking_uri(tracking_uri)
        # the tracker ends the run after this record; the signature is given explicitly, and an input
        # example would load and run the policy: MLflow's warning about it is dropped (recorded, since
        # MLflow's own "once" filter overrides an "ignore"), any other passed on
        with mlflow.start_run(run_id=run_id), warnings.catch_warnings(record=True) as caught:
            info = mlflow.pyfunc.log_model(
                name="policy", python_model=str(MODEL_CODE),
                artifacts={"checkpoint": op["checkpoint"], "config": op["config"]},
                pip_requirements=PIP_REQUIREMENTS, signature=signature,
                metadata={"trace_rl_run_id": op.get("run", ""), "checkpoint": op.get("source", "")})
        for w in caught:
            if "An input example was not provided" not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        uri = info.model_uri
    if name and not [v for v in client.search_model_versions(f"run_id = '{run_id}'") if v.name == name]:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.register_model(uri, name)
    return uri


def _run_models(client: Any, run_id: str) -> list[Any]:
    """The logged models ``policy`` of an MLflow run."""
    exp = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}' AND name = 'policy'")
    return list(found)
