"""Config and data bombs: aliases are bounded before they expand, a data file
must be a regular file, and a bad row (oversized, not UTF-8, a lone surrogate, a 5,000-digit
number) is skipped with the rest of the file kept."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.cli.test_user_errors import _fails_cleanly
from trace_core.config import load_train_config
from trace_core.config.io import ConfigError
from trace_core.envs.datasets import DataError, read_file
from trace_core.envs.datasets_config import DatasetFile

SAMPLE = Path(__file__).resolve().parents[2] / "trace_core" / "data" / "samples" / "gsm8k.jsonl"


def _laughs(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, match", [
    (_laughs(9), "billion laughs"),          # ~1 KB, 9^10 strings once expanded
    (_laughs(7), "billion laughs"),          # a 73 MB error message before
    ("run: &r\n  x: *r\n", "recursive alias"),
])
def test_alias_bombs_are_refused_at_once(tmp_path, text, match):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(text)
    assert cfg.stat().st_size < 1500
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=match) as err:
        load_train_config(cfg)
    assert time.monotonic() - t0 < 5 and len(str(err.value)) < 400
    home = tmp_path / "home"
    _fails_cleanly(["train", "--config", str(cfg), "--home", str(home)], match)
    assert not home.exists()


def test_alias_bomb_in_an_override_is_refused():
    nested = _laughs(8).replace("\n", ", ").rstrip(", ")
    with pytest.raises(ConfigError, match="billion laughs"):
        load_train_config(None, ["run.seed={" + nested + "}"])


def test_ordinary_anchors_still_work(tmp_path):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("run: &r {seed: 3}\n")
    assert load_train_config(cfg).run.seed == 3


def _rows(path: Path) -> None:
    good = SAMPLE.read_bytes().splitlines()[:3]
    q = json.loads(good[0])
    bad = [
        json.dumps({**q, "question": "bad \ud800 text"}).encode(),  # a lone surrogate (escaped in JSON)
        good[1][:20] + b"\xff" + good[1][20:],  # one byte that is not UTF-8
        good[2][:-1] + b', "id": ' + b"9" * 5000 + b"}",  # a 5,000-digit JSON number
        json.dumps({**q, "question": "x" * (2 << 20)}).encode(),  # a 2 MB row
        json.dumps({**q, "question": "y " * 30_000}).encode(),  # a 60,000-character question
    ]
    path.write_bytes(b"\n".join([good[0], *bad, good[1], good[2]]) + b"\n")


def test_bad_rows_are_skipped_and_the_file_kept(tmp_path):
    path = tmp_path / "hostile.jsonl"
    _rows(path)
    tasks, problems = read_file(DatasetFile(path=str(path), loader="gsm8k"), "data.train[0]", "skip")
    assert len(tasks) == 3 and len(problems) == 5, problems
    for line, why in zip(range(2, 7), ("lone surrogate", "not UTF-8", "not JSON", "row of", "question of"),
                         strict=True):
        assert any(p.startswith(f"{path}:{line}:") and why in p for p in problems), (why, problems)
    with pytest.raises(DataError, match=f"{path}:2: bad gsm8k row"):
        read_file(DatasetFile(path=str(path), loader="gsm8k"), "data.train[0]", "error")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_data_path_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = tmp_path / "data.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    t0 = time.monotonic()
    with pytest.raises(DataError, match="not a regular file"):
        read_file(DatasetFile(path=str(path), loader="gsm8k"), "data.train[0]", "skip")
    assert time.monotonic() - t0 < 2
