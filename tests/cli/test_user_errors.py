"""User errors end with one line on stderr and exit 2, never a traceback, and touch nothing."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app
from trace_core.config import load_train_config
from trace_core.config.io import ConfigError
from trace_core.home import queries
from trace_core.home.shards import ShardWriter
from trace_core.stages.run import RunRef, check_run_id

runner = CliRunner()


def _fails_cleanly(args: list[str], match: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    err = result.stderr.strip()
    assert "Traceback" not in result.output and len(err.splitlines()) == 1, err
    assert match in err, err
    return err


# ------------------------------------------------------------------------------------ run ids
@pytest.mark.parametrize("bad", ["../../x", "..", ".", "a/b", "", "-x", ".hidden", "x y", "a\0b", "é"])
def test_bad_run_ids_are_refused(bad):
    with pytest.raises(ValueError, match="invalid run id"):
        check_run_id(bad)
    with pytest.raises(ValueError, match="invalid run id"):
        RunRef("home", bad)


@pytest.mark.parametrize("good", ["r", "trace-20260101-120000-abc123", "a.b_c-1", "0"])
def test_good_run_ids_pass(good):
    assert RunRef("home", good).run_dir == Path("home") / "runs" / good


@pytest.mark.parametrize("cmd", ["train", "compare", "headroom"])
def test_cli_refuses_a_run_id_that_leaves_the_home(tmp_path, cmd):
    home = tmp_path / "inner" / "home"
    _fails_cleanly([cmd, "--run-id", "../../x", "--home", str(home)], "invalid run id")
    assert not (tmp_path / "inner").exists() and not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------- sql homes
def _home_with_run(home: Path, run: str) -> None:
    ShardWriter(home, run, strategy="trace").write(
        "iterations", pl.DataFrame({"iteration": [0], "budget_asked": [8], "budget_used": [8]}),
        stage="final", iteration=0)


def test_sql_on_a_mistyped_home_fails_and_creates_nothing(tmp_path):
    missing = tmp_path / "no-such-home"
    _fails_cleanly(["sql", "iteration_summary", "--home", str(missing)], "no node store")
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails_cleanly(["sql", "iteration_summary", "--home", str(empty)], "no node store")
    assert list(empty.iterdir()) == []


def test_sql_with_glob_characters_in_home_reads_no_other_home(tmp_path):
    _home_with_run(tmp_path / "h1", "r1")
    _home_with_run(tmp_path / "h2", "r2")
    assert queries.run_named_query(tmp_path / "h1", "iteration_summary")["run_id"].to_list() == ["r1"]
    glob_home = tmp_path / "h?"
    _home_with_run(glob_home, "r3")  # even a real directory of that name is refused
    with pytest.raises(ValueError, match="glob characters"):
        queries.sql_command("iteration_summary", home_dir=glob_home)
    _fails_cleanly(["sql", "iteration_summary", "--home", str(tmp_path / "h*")], "glob characters")
    _fails_cleanly(["train", "--home", str(tmp_path / "[h]1")], "glob characters")


def test_sql_still_answers_on_a_real_home(tmp_path):
    _home_with_run(tmp_path / "h1", "r1")
    result = runner.invoke(app, ["sql", "iteration_summary", "--home", str(tmp_path / "h1"), "--format", "csv"])
    assert result.exit_code == 0 and "r1" in result.stdout


# ------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("content, match", [
    (b"run: {iterations: 2\n", "not valid YAML"),
    (b"run:\n  iterations: 2\x00\n", "NUL byte"),
    (b"run:\n  seed: \xff\xfe\n", "not UTF-8"),
    (b"- a\n- b\n", "mapping at the top level"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, content, match):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        load_train_config(cfg)
    home = tmp_path / "home"
    for cmd in (["train"], ["compare"], ["warmup", "--out", str(tmp_path / "w")]):
        args = [*cmd, "--config", str(cfg)] + (["--home", str(home)] if cmd[0] != "warmup" else [])
        _fails_cleanly(args, match)
    assert not home.exists()


def test_home_that_is_a_file(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a directory")
    _fails_cleanly(["train", "--home", str(home)], "is a file")
    _fails_cleanly(["sql", "iteration_summary", "--home", str(home)], "is a file")


def test_sql_out_that_is_a_directory(tmp_path):
    _home_with_run(tmp_path / "h1", "r1")
    out = tmp_path / "outdir"
    out.mkdir()
    for fmt in ("csv", "parquet"):
        _fails_cleanly(["sql", "iteration_summary", "--home", str(tmp_path / "h1"), "--format", fmt,
                        "--out", str(out)], "is a directory")


# ------------------------------------------------------------------------------------- size limits
@pytest.mark.parametrize("override, field", [
    ("run.candidate_pool=10000000", "run.candidate_pool"),
    ("run.train_prompts=10000000", "run.train_prompts"),
    ("allocation.budget_total=10000000", "allocation.budget_total"),
])
def test_oversized_config_is_refused_naming_the_field(tmp_path, override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_train_config(None, [override])
    result = runner.invoke(app, ["train", "--set", override, "--home", str(tmp_path / "h")])
    assert result.exit_code == 2 and field in result.stderr and "10000000" in result.stderr
    assert not (tmp_path / "h").exists()


def test_limits_leave_room_for_real_runs():
    cfg = load_train_config(None, ["run.candidate_pool=100000", "run.train_prompts=1000000",
                                   "allocation.budget_total=100000"])
    assert cfg.run.candidate_pool == 100_000


def test_a_stop_signal_leaves_no_traceback_in_the_logs(caplog):
    """Prefect's crash handling logs the errors its cleanup raises once a SIGTERM has cut it short
    (seen: "ValueError: Task run is not set" with its traceback before the one line): inside a
    stoppable command such a record keeps its message and loses its traceback; others keep theirs."""
    import logging

    from prefect.exceptions import TerminationSignal

    from flows.cli_checks import _quiet_stop_tracebacks
    from flows.lifecycle import Interrupted

    log = logging.getLogger("prefect.task_engine.test")
    before = logging.getLogRecordFactory()  # Ray and Prefect may have set their own

    def crash_after_signal():
        try:
            raise TerminationSignal(signal=15)
        except TerminationSignal:
            raise ValueError("Task run is not set")  # noqa: B904 - the chain is the point

    with caplog.at_level(logging.ERROR), _quiet_stop_tracebacks(Interrupted):
        for fn in (crash_after_signal, lambda: 1 / 0):
            try:
                fn()
            except Exception:
                log.error("crashed", exc_info=True)
    after_signal, other = caplog.records[-2:]
    assert after_signal.exc_info is None and after_signal.getMessage() == "crashed"
    assert other.exc_info is not None and other.exc_info[0] is ZeroDivisionError
    assert logging.getLogRecordFactory() is before  # restored
