"""Stage cache keys: the same inputs under a moved home or checkout give the
same key; a change of what a stage computes gives another; retention and timeout settings don't
count (they change what is kept, not what is computed)."""

from __future__ import annotations

from pathlib import Path

from tasks.cache import CHECKOUT, PortableInputs
from trace_core.config import TrainConfig
from trace_core.envs import datasets
from trace_core.stages.run import RunRef


def _key(home: str, cfg: TrainConfig, checkpoint: str) -> str:
    inputs = {"ref": RunRef(home, "r"), "cfg": cfg, "iteration": 0, "checkpoint": checkpoint}
    return PortableInputs(home=home).compute_key(None, inputs, {})


def test_keys_follow_what_is_computed_not_where(tmp_path):
    cfg = TrainConfig()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    shipped = str(Path(CHECKOUT) / "assets" / "tiny-warm")
    base = _key(a, cfg, shipped)
    assert _key(b, cfg, shipped) == base  # the home moved
    assert _key(b, cfg, f"{b}/runs/r/checkpoints/iter=00000") == _key(a, cfg, f"{a}/runs/r/checkpoints/iter=00000")
    assert _key(a, cfg, "/elsewhere/model") != base  # another checkpoint
    assert _key(a, cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": cfg.run.seed + 1})}), shipped) != base
    kept = cfg.model_copy(update={"run": cfg.run.model_copy(update={"keep_checkpoints": 2, "stage_timeout_s": 60.0})})
    assert _key(a, kept, shipped) == base


def test_an_edited_dataset_file_changes_the_key(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    held = tmp_path / "test.jsonl"
    held.write_text('{"question": "5+5?", "answer": "#### 10"}\n')
    cfg = TrainConfig.model_validate({"data": {"train": [{"path": str(data), "loader": "gsm8k"}],
                                               "heldout": [{"path": str(held), "loader": "gsm8k"}]}})
    home = str(tmp_path / "h")
    before = _key(home, cfg, "/m")
    assert _key(home, cfg, "/m") == before
    data.write_text('{"question": "1+2?", "answer": "#### 3"}\n')
    datasets._LOADED.clear()  # the resume that reads the edited file is a new process
    assert _key(home, cfg, "/m") != before
