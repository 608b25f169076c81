"""Nothing on disk is code: pickle payloads planted in every
state file of a run home and a model directory never run, checkpoints are swapped in atomically
with default file modes, and the stage cache key tracks the package source."""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import stat
from pathlib import Path

import cloudpickle
import numpy as np
import polars as pl
import pytest
import torch

from tests.tinypolicy import one_thread, tiny_model  # noqa: F401
from trace_core.home.layout import write_parquet_atomic
from trace_core.policy import checkpoint as ck
from trace_core.policy.update import UpdateConfig, make_optimizer
from trace_core.stages.results import Evaluation
from trace_core.stages.run import RunRef


class Payload:
    """Unpickling this touches ``marker``: the stand-in for arbitrary code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _pickled(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker), protocol=4)


def test_payload_really_runs_when_unpickled(tmp_path):
    """Control: the planted files would run code under ``torch.load(weights_only=False)``
    (what the landed trainer-state loader did)."""
    marker = tmp_path / "ran"
    torch.save(Payload(marker), tmp_path / "trainer_state.pt")
    torch.load(tmp_path / "trainer_state.pt", weights_only=False)
    assert marker.exists()


@pytest.fixture
def saved_checkpoint(tmp_path):
    model = tiny_model(seed=1)
    opt, sched = make_optimizer(model, UpdateConfig(lr=1e-3, warmup_steps=2))
    return ck.save_checkpoint(tmp_path / "ck", model, optimizer=opt, scheduler=sched,
                              rng=np.random.default_rng(3), cursor={"iteration": 1})


def test_trainer_state_is_data_and_round_trips(saved_checkpoint):
    path = saved_checkpoint / ck.STATE_FILE
    assert path.is_file() and not (saved_checkpoint / ck.LEGACY_STATE_FILE).exists()
    assert path.read_bytes()[8:9] == b"{"  # a safetensors header, not a pickle / zip
    state = ck.load_trainer_state(path)
    assert isinstance(state["rng"]["python"], tuple) and state["rng"]["python"] == _roundtrip_python_rng()
    assert state["rng"]["generator"]["bit_generator"] == "PCG64"
    assert state["cursor"] == {"iteration": 1}


def _roundtrip_python_rng():
    import random

    return random.getstate()


def test_planted_payloads_in_run_home_and_model_dir_never_run(tmp_path, saved_checkpoint):
    """Plant a pickle in every state file a resume or a ``model.path`` would read; load each
    the way the pipeline does; the marker never appears."""
    from trace_core.predictor import load_predictor

    marker = tmp_path / "ran"
    ref = RunRef(str(tmp_path / "home"), "r")
    # predictor state (runs/<id>/predictor/iter=*.safetensors), as torch.save and as a raw pickle
    pred = ref.predictor(0)
    torch.save(Payload(marker), pred)
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load_predictor(pred)
    pred.write_bytes(_pickled(marker))
    with pytest.raises(ValueError):
        load_predictor(pred)

    # trainer state of a run checkpoint: the current name holding a pickle ...
    run_ck = ref.checkpoint(0)
    shutil.copytree(saved_checkpoint, run_ck)
    torch.save(Payload(marker), run_ck / ck.STATE_FILE)
    model = tiny_model(seed=1)
    opt, sched = make_optimizer(model, UpdateConfig(lr=1e-3, warmup_steps=2))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        ck.load_checkpoint(run_ck, model, optimizer=opt, scheduler=sched)
    (run_ck / ck.STATE_FILE).write_bytes(_pickled(marker))
    with pytest.raises(ValueError):
        ck.load_checkpoint(run_ck, model, optimizer=opt, scheduler=sched)

    # ... and a model directory (model.path) carrying the old pickled trainer_state.pt
    model_dir = tmp_path / "model"
    shutil.copytree(saved_checkpoint, model_dir)
    (model_dir / ck.STATE_FILE).unlink()
    torch.save(Payload(marker), model_dir / ck.LEGACY_STATE_FILE)
    assert not (model_dir / ck.STATE_FILE).is_file()  # what update_policy checks before loading
    with pytest.raises(ValueError, match="refusing to unpickle"):
        ck.has_trainer_state(model_dir)
    with pytest.raises(ValueError, match="refusing to unpickle"):
        ck.load_checkpoint(model_dir, model, optimizer=opt, scheduler=sched)

    # Prefect's result cache: a record that declares the pickle serializer
    store, key = _stage_result_store(Path(ref.home))
    store.write(Evaluation(accuracy=0.5), key=key)
    assert store.read(key).result == Evaluation(accuracy=0.5)  # what we wrote reads back
    _plant_pickle_record(Path(ref.home), key, marker)
    with pytest.raises(ValueError, match="refusing to load"):
        _stage_result_store(Path(ref.home))[0].read(key)

    assert not marker.exists()


def _stage_result_store(home: Path):
    """A ``ResultStore`` configured exactly as the stage tasks' (storage, key storage, serializer)."""
    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore
    from prefect.serializers import Serializer

    from tasks.stages import stage_tasks

    task = stage_tasks(home).evaluate
    store = ResultStore(result_storage=LocalFileSystem(basepath=str(task.result_storage)),
                        metadata_storage=task.cache_policy.key_storage,
                        serializer=Serializer(type=task.result_serializer), cache_result_in_memory=False)
    return store, "k" * 32


def _plant_pickle_record(home: Path, key: str, marker: Path) -> None:
    meta_path = home / "prefect-results" / "keys" / key
    meta = json.loads(meta_path.read_text())
    meta["serializer"] = {"type": "pickle", "picklelib": "cloudpickle", "picklelib_version": None}
    meta_path.write_text(json.dumps(meta))
    Path(meta["storage_key"]).write_bytes(base64.b64encode(cloudpickle.dumps(Payload(marker))))


def test_plain_prefect_storage_would_run_the_planted_record(tmp_path):
    """Control for the cache half: Prefect's own local storage honours the planted serializer."""
    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore
    from prefect.serializers import Serializer

    marker = tmp_path / "ran"
    root = tmp_path / "home" / "prefect-results"
    store = ResultStore(result_storage=LocalFileSystem(basepath=str(root / "values")),
                        metadata_storage=LocalFileSystem(basepath=str(root / "keys")),
                        serializer=Serializer(type="json"), cache_result_in_memory=False)
    store.write(Evaluation(accuracy=0.5), key="k" * 32)
    _plant_pickle_record(tmp_path / "home", "k" * 32, marker)
    store.read("k" * 32)
    assert marker.exists()


@pytest.mark.parametrize("change", ["decoder", "class", "outside"])
def test_json_records_that_would_import_or_call_are_refused(tmp_path, change):
    """A JSON record is code too if it names a decoder (``subprocess.run``), a class to build,
    or a value file outside the home's results."""
    home = tmp_path / "home"
    store, key = _stage_result_store(home)
    store.write(Evaluation(accuracy=0.5), key=key)
    meta_path = home / "prefect-results" / "keys" / key
    meta = json.loads(meta_path.read_text())
    if change == "decoder":
        meta["serializer"]["object_decoder"] = "subprocess.run"
        meta_path.write_text(json.dumps(meta))
    elif change == "class":
        Path(meta["storage_key"]).write_text(json.dumps({"__class__": "subprocess.Popen", "data": ["true"]}))
    else:
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text("{}")
        meta["storage_key"] = str(elsewhere)
        meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="refusing to load|only trace_core"):
        _stage_result_store(home)[0].read(key)


# ------------------------------------------------------------------------------------- atomic swap
def test_save_checkpoint_swaps_without_a_gap_and_leaves_others_temp_dirs(tmp_path, monkeypatch):
    model = tiny_model(seed=1)
    path = ck.save_checkpoint(tmp_path / "ck", model, cursor={"iteration": 1})
    foreign = tmp_path / "ck.tmp"  # another writer's fixed-name temp dir (the landed scheme)
    foreign.mkdir()
    (foreign / "half-written").write_text("x")

    real_rmtree = shutil.rmtree
    seen = []

    def rmtree_then_check(p, *a, **k):
        real_rmtree(p, *a, **k)
        seen.append((path / "model.safetensors").is_file())  # the checkpoint never has a gap

    monkeypatch.setattr(ck.shutil, "rmtree", rmtree_then_check)
    ck.save_checkpoint(path, model, cursor={"iteration": 2})
    assert seen and all(seen)
    assert ck.load_trainer_state(path / ck.STATE_FILE)["cursor"] == {"iteration": 2}
    assert (foreign / "half-written").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "ck.tmp"]


def test_failed_save_keeps_the_old_checkpoint_and_no_temp(tmp_path, monkeypatch):
    model = tiny_model(seed=1)
    path = ck.save_checkpoint(tmp_path / "ck", model, cursor={"iteration": 1})

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_trainer_state", boom)
    with pytest.raises(OSError):
        ck.save_checkpoint(path, model, cursor={"iteration": 2})
    assert ck.load_trainer_state(path / ck.STATE_FILE)["cursor"] == {"iteration": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_replace_dir_without_exchange_falls_back(tmp_path, monkeypatch):
    monkeypatch.setattr(ck, "_exchange", lambda a, b: False)
    old, new = tmp_path / "ck", tmp_path / "new"
    old.mkdir()
    (old / "f").write_text("old")
    new.mkdir()
    (new / "f").write_text("new")
    ck.replace_dir(new, old)
    assert (old / "f").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["ck"]


# ------------------------------------------------------------------------------------- file modes
@pytest.fixture
def umask():
    def set_(mask: int):
        return os.umask(mask)

    old = os.umask(0o022)
    os.umask(old)
    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_shards_and_checkpoints_get_default_modes(tmp_path, umask, mask):
    umask(mask)
    shard = write_parquet_atomic(pl.DataFrame({"a": [1]}), tmp_path / "s" / "x.parquet")
    assert stat.S_IMODE(shard.stat().st_mode) == 0o666 & ~mask
    path = ck.save_checkpoint(tmp_path / "ck", tiny_model(seed=1), cursor={})
    assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~mask
    for f in path.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f.name


# ------------------------------------------------------------------------------------- cache key
def test_cache_key_tracks_the_package_source(tmp_path, monkeypatch):
    from tasks import cache
    from tasks.stages import stage_tasks

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "stage.py").write_text("def generate_raw():\n    return 1\n")
    before = cache.source_digest(pkg)
    moved = tmp_path / "moved"
    shutil.copytree(pkg, moved)
    assert cache.source_digest(moved) == before  # a moved checkout keeps its keys
    (pkg / "sub" / "stage.py").write_text("def generate_raw():\n    return 2\n")
    assert cache.source_digest(pkg) != before  # an edited stage does not

    policy = stage_tasks(tmp_path / "home").generate_raw_rollouts.cache_policy
    inputs = {"iteration": 0, "checkpoint": "c"}
    monkeypatch.setattr(cache, "package_digest", lambda: "a" * 64)
    key_a = policy.compute_key(task_ctx=None, inputs=inputs, flow_parameters={})
    monkeypatch.setattr(cache, "package_digest", lambda: "b" * 64)
    key_b = policy.compute_key(task_ctx=None, inputs=inputs, flow_parameters={})
    assert key_a != key_b
