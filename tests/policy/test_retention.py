"""Checkpoint retention (run.keep_checkpoints): which checkpoints keep their files, and what a
retired one leaves behind (real checkpoints of a real tiny model)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.tinypolicy import one_thread, spread_model, tiny_tokenizer  # noqa: F401
from trace_core.policy.checkpoint import (
    RETIRED_FILE,
    checkpoints_to_keep,
    has_trainer_state,
    is_retired,
    load_model_state,
    retire_checkpoints,
    save_checkpoint,
)
from trace_core.policy.update import UpdateConfig, make_optimizer
from trace_core.stages.results import output_problem


def test_keep_newest_and_best():
    its = [0, 1, 2, 3, 4]
    assert checkpoints_to_keep(its, {}, None) == set(its)  # default: keep all
    assert checkpoints_to_keep(its, {}, 2) == {3, 4}
    assert checkpoints_to_keep(its, {1: 0.7, 3: 0.5, 4: None}, 1) == {1, 4}  # best by held-out accuracy
    assert checkpoints_to_keep(its, {1: 0.7, 3: 0.5}, 1, keep_best=False) == {4}
    assert checkpoints_to_keep(its, {1: 0.7, 2: 0.7}, 1) == {2, 4}  # a tie: the newer
    assert checkpoints_to_keep(its, {9: 1.0}, 1) == {4}  # no checkpoint for that iteration
    with pytest.raises(ValueError, match="resume needs the newest"):
        checkpoints_to_keep(its, {}, 0)


def test_retired_checkpoints_leave_a_marker(tmp_path):
    torch.manual_seed(0)
    model = spread_model(seed=3)
    opt, sched = make_optimizer(model, UpdateConfig(lr=1e-3))
    root = tmp_path / "checkpoints"
    for i in range(4):
        save_checkpoint(root / f"iter={i:05d}", model, optimizer=opt, scheduler=sched, tokenizer=tiny_tokenizer())
    full = sum(p.stat().st_size for p in (root / "iter=00000").rglob("*") if p.is_file())

    assert retire_checkpoints(root, {1: 0.6, 2: 0.4}, None) == []  # keep all: nothing happens
    retired = retire_checkpoints(root, {1: 0.6, 2: 0.4}, keep_last=1)
    assert [p.name for p in retired] == ["iter=00000", "iter=00002"]  # 3 newest, 1 best
    for name in ("iter=00001", "iter=00003"):
        assert has_trainer_state(root / name) and (root / name / "model.safetensors").is_file()
    for p in retired:
        assert [f.name for f in p.iterdir()] == [RETIRED_FILE] and is_retired(p)
        note = json.loads((p / RETIRED_FILE).read_text())
        assert "model.safetensors" in note["removed"] and note["bytes"] == full
        assert output_problem(p) is None  # a replayed stage record naming it is not "lost"
        with pytest.raises(FileNotFoundError, match="retired by run.keep_checkpoints"):
            load_model_state(p)
        with pytest.raises(FileNotFoundError, match="retired by run.keep_checkpoints"):
            has_trainer_state(p)
    assert not list(root.glob(".*"))  # no temporary left behind

    # the next iteration: 3 is no longer the newest; 1 stays (best), 3 is retired, 4 kept
    save_checkpoint(root / "iter=00004", model, optimizer=opt, scheduler=sched)
    assert [p.name for p in retire_checkpoints(root, {1: 0.6, 2: 0.4}, keep_last=1)] == ["iter=00003"]
    assert retire_checkpoints(root, {1: 0.6, 2: 0.4}, keep_last=1) == []  # idempotent (a resume replays it)


def test_a_replay_does_not_retire_checkpoints_it_has_not_reached(tmp_path):
    """A resume replays iterations 0, 1, 2 with iter=00000..00002 on disk (0 already retired);
    after replaying 0 only its accuracy is known: iteration 1, the best, must not be retired then
    for want of a score that the replay of iteration 1 is about to give."""
    model = spread_model(seed=3)
    root = tmp_path / "checkpoints"
    for i in range(3):
        save_checkpoint(root / f"iter={i:05d}", model)
    acc = {0: 0.5, 1: 0.5, 2: 0.42}
    assert [p.name for p in retire_checkpoints(root, {0: 0.5}, 1, newest=0)] == []
    assert [p.name for p in retire_checkpoints(root, {0: 0.5, 1: 0.5}, 1, newest=1)] == ["iter=00000"]
    assert retire_checkpoints(root, acc, 1, newest=2) == []  # 2 newest, 1 best (the newer of a tie)
    for i in (0, 1, 2):  # the replay: the same calls again change nothing
        assert retire_checkpoints(root, {k: v for k, v in acc.items() if k <= i}, 1, newest=i) == []
    assert [is_retired(root / f"iter={i:05d}") for i in range(3)] == [True, False, False]

