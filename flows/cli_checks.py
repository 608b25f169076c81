"""What the CLI checks before a command starts (home, run id, lock, config, models, data: one
line and exit 2 on anything wrong) and how a long command ends on a stop signal (one line, exit
128 + signal)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
from pathlib import Path

import typer

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def _stoppable(after: str):
    """A long command that ends on SIGTERM / SIGINT, from its first line, with one line
    (``interrupted by SIGTERM: <after>``) and exit 128 + signal. Prefect's own handler (inside a
    flow run) raises ``TerminationSignal``; both end here."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            from flows.lifecycle import Interrupted, stop_on_signals

            try:
                with stop_on_signals(), _quiet_stop_tracebacks(Interrupted):
                    return fn(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - re-raised unless it is a stop signal
                signum = _stop_signal(err, Interrupted)
                if signum is None:
                    raise
            typer.secho(f"interrupted by {signal.Signals(signum).name}: {after}", fg=typer.colors.RED, err=True)
            raise typer.Exit(128 + signum)
        return run
    return wrap


@contextlib.contextmanager
def _quiet_stop_tracebacks(interrupted: type):
    """While the block runs, a log record whose exception was caused by a stop signal (Prefect's
    crash handling logs the errors its own cleanup raises once the signal has cut it short, e.g.
    "Task run is not set") keeps its message and loses its traceback: a stop ends in one line.
    Any other exception's traceback is logged as before."""
    old = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = old(*args, **kwargs)
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and _stop_signal(exc, interrupted) is not None:
            record.exc_info, record.exc_text = None, None
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:  # a library that wrapped ours meanwhile (Ray's ray.init does) keeps its wrapper
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(old)


def _stop_signal(err: BaseException, interrupted: type) -> int | None:
    """The stop signal behind ``err`` or an exception it was raised in handling (cleanup that
    failed because a signal cut it short), else None: our ``Interrupted``, Prefect's
    ``TerminationSignal``, or a plain ``KeyboardInterrupt`` (SIGINT met before our handler or
    after a library restored Python's; click would turn it into "Aborted!" and exit 1)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, interrupted):
            return seen.signum
        if type(seen).__name__ == "TerminationSignal" and isinstance(getattr(seen, "signal", None), int):
            return seen.signal
        if isinstance(seen, KeyboardInterrupt):
            return int(signal.SIGINT)
        seen = seen.__cause__ or seen.__context__
    return None


RESUME = "run stopped; rerun with the same --run-id to resume"


def _check_home(home: Path, create: bool = True) -> None:
    """A usable run home or exit 2 with one line: a directory (or creatable), no glob characters."""
    from trace_core.home.layout import check_home_path

    try:
        check_home_path(home)
        if home.exists() and not home.is_dir():
            raise NotADirectoryError(f"--home {home} is a file, not a directory")
        if create:
            home.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as err:
        _fail(err)


def _check_run_id(run_id: str | None) -> None:
    from trace_core.stages.run import check_run_id

    if run_id is not None:
        try:
            check_run_id(run_id)
        except ValueError as err:
            _fail(err)


def _check_unlocked(home: Path, run_id: str) -> None:
    """Exit 2 with the holder's pid and host if another live process is writing this run (the
    flow takes the lock itself for the whole run: trace_core.home.lock)."""
    from trace_core.home.lock import RunLocked, acquire_run_lock, release_run_lock
    from trace_core.stages.run import RunRef

    try:
        release_run_lock(acquire_run_lock(RunRef(str(home.resolve()), run_id).run_dir))
    except RunLocked as err:
        _fail(err)


def _quiet_env(home: Path) -> None:
    """Keep Prefect/MLflow state inside the run home and switch telemetry off."""
    _check_home(home)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("PREFECT_HOME", str((home / "prefect").resolve()))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str((home / "prefect" / "storage").resolve()))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the temporary local server needs 5-16 s on 2 busy cores; the default wait is too short
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # third-party progress bars and notices (weights loading / saving, artifact copies, MLflow's
    # database set-up) say nothing about the run: the flow's own log lines do
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def _fail(err: Exception) -> None:
    """Print the error (its own line breaks kept, e.g. one line per bad config field) and exit 2."""
    raw = err.args[0] if isinstance(err, KeyError) and err.args else str(err)  # str(KeyError) adds quotes
    text = raw if isinstance(err, ValueError) and "\n" in raw else " ".join(str(raw).split())
    typer.secho(text or type(err).__name__, fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _train_config(config: Path | None, overrides: list[str] | None, home: Path):
    """The validated run config (an invalid one exits 2 with the field path and bad value)."""
    from trace_core.config import load_train_config
    from trace_core.config.io import ConfigError
    from trace_core.runtime import check_names

    _check_home(home, create=False)
    try:
        cfg = check_names(load_train_config(config or DEFAULT_CONFIG, overrides or []))
    except ConfigError as err:
        _fail(err)
    _check_model(cfg)
    _check_data(cfg)
    _check_models(cfg)
    _quiet_env(home)  # created only for a valid config
    return cfg


def _check_model(cfg) -> None:
    """The model the run starts from must be there: a missing directory exits 2 with one line,
    before a home, a flow run or a runs row exists."""
    from trace_core.stages.run import initial_checkpoint

    try:
        initial_checkpoint(cfg)
    except FileNotFoundError as err:
        _fail(err)


def _fail_if_disk_full(err: BaseException) -> None:
    """A full disk anywhere in the error's chain (shards, checkpoints, DuckDB, SQLite): one line,
    exit 2; what finished is on disk and the same --run-id resumes once space is freed."""
    import errno

    seen = err
    while seen is not None:
        text = str(seen)
        if getattr(seen, "errno", None) == errno.ENOSPC or "No space left on device" in text \
                or "database or disk is full" in text:
            where = getattr(seen, "filename", None)
            _fail(OSError(f"disk full{f' writing {where}' if where else ''}: free space, then rerun with the "
                          "same --run-id to resume from the last finished stage"))
        seen = seen.__cause__ or seen.__context__


def _check_models(cfg) -> None:
    """Every model directory the config names is checked before anything starts (safetensors and
    JSON only, ``trace_core.policy.modeldir``): a missing or hostile one exits 2 with one line."""
    from trace_core.policy.modeldir import ModelDirError, check_model_dir

    named = {"model.path": cfg.model.path, "predictor.encoder_path": getattr(cfg.predictor, "encoder_path", None)}
    for field, path in named.items():
        if path:
            try:
                check_model_dir(path)
            except ModelDirError as err:
                _fail(ValueError(f"{field}: {err}"))


def _check_data(cfg) -> None:
    """Load the data section's files now (a line per file); a missing file, a bad row under
    ``on_bad_row: error`` or an empty set exits 2 with one line, before anything starts."""
    if not cfg.data.enabled:
        return
    from trace_core.envs.datasets import DataError, loaded

    try:
        loaded(cfg.data, progress=lambda line: typer.echo(line, err=True))
    except DataError as err:
        _fail(err)
