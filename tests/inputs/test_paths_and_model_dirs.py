"""Hostile files and bad input: ``--out`` never replaces or follows
what it names, model directories are checked (safetensors and JSON only) before anything loads
them, a copied home's catalogue answers for the copy, and bad input ends in one line, exit 2."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import duckdb
import pytest

from tests.cli.test_user_errors import _fails_cleanly, _home_with_run, runner
from trace_core.policy.model import TINY_WARM_DIR, load_policy
from trace_core.policy.modeldir import ModelDirError, check_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from store_fixture import build_fixture_store  # noqa: E402

from trace_core import store  # noqa: E402

needs_tiny = pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(), reason="shipped tiny checkpoint missing")


# -------------------------------------------------------------------------- --out names a regular file
def _targets(tmp_path: Path) -> dict[str, Path]:
    """A symlink to a file outside, a FIFO, a character device (like /dev/full, made as root)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "link.html"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = {"symlink": link, "fifo": fifo}
    if os.geteuid() == 0:
        dev = tmp_path / "full"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        out["device"] = dev
    return out


@pytest.mark.parametrize("cmd", ["sql-csv", "sql-parquet", "report"])
def test_out_never_replaces_a_link_a_device_or_a_fifo(tmp_path, cmd):
    home = tmp_path / "h"
    _home_with_run(home, "r1")
    for kind, target in _targets(tmp_path).items():
        before = os.lstat(target)
        if cmd == "report":
            args = ["report", "r1", "--home", str(home), "--out", str(target)]
        else:
            args = ["sql", "iteration_summary", "--home", str(home), "--format", cmd.split("-")[1], "--out", str(target)]
        _fails_cleanly(args, "--out")  # at once: a FIFO without a reader does not block
        after = os.lstat(target)
        assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino), kind
    assert (tmp_path / "victim.txt").read_text() == "keep me"


def test_out_to_a_regular_file_is_written_whole(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    home = tmp_path / "h"
    _home_with_run(home, "r1")
    out = tmp_path / "q.csv"
    out.write_text("old")
    res = CliRunner().invoke(app, ["sql", "iteration_summary", "--home", str(home), "--format", "csv", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("run_id") and not list(tmp_path.glob(".q.csv.*"))


# --------------------------------------------------------------------------------- hostile model directories
def _hostile_dirs(tmp_path: Path) -> dict[str, Path]:
    """14 model directories that must be refused before anything loads them."""
    import torch

    def base(name: str, skip: tuple[str, ...] = ()) -> Path:
        d = tmp_path / name
        d.mkdir()
        for f in TINY_WARM_DIR.iterdir():
            if f.name not in skip:
                shutil.copy(f, d / f.name)
        return d

    out = {"missing": tmp_path / "no-such-model"}
    out["no config"] = base("noconfig", skip=("config.json",))
    d = base("garbage-config"); (d / "config.json").write_bytes(b"\x00\xff{not json")  # noqa: E702
    out["garbage config"] = d
    d = base("list-config"); (d / "config.json").write_text("[1, 2]")  # noqa: E702
    out["config a list"] = d
    d = base("no-type"); (d / "config.json").write_text('{"hidden_size": 8}')  # noqa: E702
    out["config without model_type"] = d
    d = base("huge-config"); (d / "config.json").write_text('{"model_type": "qwen3", "x": "' + "a" * (2 << 20) + '"}')  # noqa: E702,E501
    out["config over 1 MB"] = d
    d = base("fifo-config", skip=("config.json",)); os.mkfifo(d / "config.json")  # noqa: E702
    out["config a FIFO"] = d
    d = base("zero-config", skip=("config.json",)); (d / "config.json").symlink_to("/dev/zero")  # noqa: E702
    out["config -> /dev/zero"] = d
    d = base("pickled", skip=("model.safetensors",))  # a real pickled state dict: loads on torch alone
    from safetensors.torch import load_file

    torch.save(load_file(TINY_WARM_DIR / "model.safetensors"), d / "pytorch_model.bin")
    out["pickled weights only"] = d
    out["no weights"] = base("noweights", skip=("model.safetensors",))
    d = base("truncated")
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    out["truncated safetensors"] = d
    d = base("garbage-weights"); (d / "model.safetensors").write_bytes(b"\xff" * 64)  # noqa: E702
    out["garbage safetensors"] = d
    d = base("fifo-weights", skip=("model.safetensors",)); os.mkfifo(d / "model.safetensors")  # noqa: E702
    out["safetensors a FIFO"] = d
    d = base("zero-tokenizer", skip=("tokenizer.json",)); (d / "tokenizer.json").symlink_to("/dev/zero")  # noqa: E702
    out["tokenizer -> /dev/zero"] = d
    return out


@needs_tiny
def test_pickled_weights_are_never_loaded(tmp_path):
    d = _hostile_dirs(tmp_path)["pickled weights only"]
    with pytest.raises(ModelDirError, match="pickled weights"):
        load_policy(d)


@needs_tiny
def test_hostile_model_directories_are_one_line_errors(tmp_path):
    dirs = _hostile_dirs(tmp_path)
    assert len(dirs) == 14
    home = tmp_path / "home"
    for why, d in dirs.items():
        with pytest.raises(ModelDirError):
            check_model_dir(d)
        _fails_cleanly(["train", "--home", str(home), "--set", f"model.path={d}"], "model.path")
        assert not home.exists(), why  # refused before the home is made
    assert check_model_dir(TINY_WARM_DIR) == TINY_WARM_DIR


# -------------------------------------------------------------------------- bad values, one line each
def test_huge_seed_names_the_field(tmp_path):
    from flows.cli import app

    res = runner.invoke(app, ["train", "--set", f"run.seed={10**30}", "--home", str(tmp_path / "h")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.strip().splitlines()[-1].strip().startswith("run.seed: Input should be less than or equal to")
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("args, match", [
    (["compare", "--strategies", "nosuch"], "unknown strategy 'nosuch'"),
    (["compare", "--strategies", ","], "no strategy"),
    (["headroom", "--run-id", "r", "--iterations", "-1"], "--iterations"),
    (["headroom", "--run-id", "r", "--iterations", "x"], "--iterations"),
])
def test_bad_values_are_one_line_errors(tmp_path, args, match):
    home = tmp_path / "home"
    _fails_cleanly([*args, "--home", str(home)], match)
    assert not home.exists()


# ---------------------------------------------------------------------------------- the catalogue of a copied home
def _count(catalogue: Path, table: str) -> int:
    with duckdb.connect(str(catalogue), read_only=True) as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_copied_home_with_a_truncated_shard_rebuilds_its_catalogue(tmp_path):
    orig = build_fixture_store(tmp_path / "orig")
    assert store.ensure_catalog(orig)
    n_iter = _count(orig / "trace.duckdb", "iterations")
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy, symlinks=True)  # cp -a
    shard = sorted((copy / "shards" / "nodes").rglob("iteration=*/*.parquet"))[0]
    with open(shard, "r+b") as f:
        f.truncate(100)
    shutil.rmtree(orig / "shards" / "iterations")  # what the copy's catalogue must not read any more
    assert store.ensure_catalog(copy)  # no InvalidInputException: the bad shard is named and left out
    assert _count(copy / "trace.duckdb", "iterations") == n_iter  # the copy's shards, not the original's
    with duckdb.connect(str(copy / "trace.duckdb"), read_only=True) as con:
        assert con.execute("SELECT schema_sha FROM catalog_meta").fetchone()[0] == "partial"  # rebuilt next time
        # the damaged partition's summary could not be rewritten: groups come from the readable nodes
        assert con.execute("SELECT count(*) FROM trajectory_groups").fetchone()[0] > 0
    shard.unlink()  # the resumed run rewrites it; the next ensure_catalog builds the full views
    assert store.ensure_catalog(copy)
    with duckdb.connect(str(copy / "trace.duckdb"), read_only=True) as con:
        assert con.execute("SELECT schema_sha FROM catalog_meta").fetchone()[0] == store.schema_sha(copy)


def test_garbage_catalogue_is_rebuilt_not_reported_busy(tmp_path, recwarn):
    home = build_fixture_store(tmp_path / "h")
    (home / "trace.duckdb").write_bytes(b"garbage" * 100)
    assert store.ensure_catalog(home)
    assert not [w for w in recwarn if "busy" in str(w.message)]
    assert _count(home / "trace.duckdb", "nodes") > 0
    assert (home / "trace.duckdb.unreadable").read_bytes().startswith(b"garbage")
