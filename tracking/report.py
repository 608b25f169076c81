"""The markdown run report and the artifact bundle (config, plots, report) logged to MLflow."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from pydantic import BaseModel

from trace_core.config.io import dump_yaml
from trace_core.home.queries import run_named_query
from tracking.html_report import write_html_report  # MLflow's artifact view renders an HTML file
from tracking.plots import write_run_plots

if TYPE_CHECKING:
    from tracking.mlflow_tracker import Tracker

_SECTIONS = (  # (heading, named query, max rows)
    ("Iterations", "iteration_summary", 50),
    ("Wasted rollouts by iteration", "wasted_by_iteration", 50),
    ("Wasted rollouts by task", "wasted_by_task", 20),
    ("Budget by branching depth", "budget_by_depth", 20),
    ("Wasted rollouts by difficulty", "wasted_by_difficulty", 30),
    ("Top wasted prompts", "top_wasted_prompts", 10),
    ("Predictor calibration", "predictor_calibration_bins", 30),
)


def markdown_table(frame: pl.DataFrame, max_rows: int = 50) -> str:
    """A GitHub-flavoured markdown table of ``frame`` (first ``max_rows`` rows)."""
    if not frame.height:
        return "_no rows_"
    shown = frame.head(max_rows)
    lines = ["| " + " | ".join(shown.columns) + " |", "|" + "---|" * shown.width]
    for row in shown.iter_rows():
        cells = ["" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)) for v in row]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if frame.height > max_rows:
        lines.append(f"\n_{frame.height - max_rows} more rows_")
    return "\n".join(lines)


def _headline(home_dir: Path, run_id: str) -> list[str]:
    by_it = run_named_query(home_dir, "wasted_by_iteration", run_id=run_id)
    if not by_it.height:
        return ["No trajectories recorded yet."]
    total = int(by_it["trajectories"].sum())
    wasted = int(by_it["wasted"].sum())
    last = by_it.row(-1, named=True)
    return [
        f"- strategy: **{last['strategy']}**, iterations: {by_it.height}",
        f"- generated trajectories: {total}, wasted: {wasted} ({wasted / total:.1%})",
        f"- effective ratio, first → last iteration: {by_it['effective_ratio'][0]:.3f} → "
        f"{last['effective_ratio']:.3f}",
        f"- generated tokens: {int(by_it['tokens'].sum())}",
    ]


def stage_seconds(iterations: pl.DataFrame) -> pl.DataFrame:
    """The ``timings`` JSON of ``iteration_summary`` as one column of seconds per stage."""
    if not iterations.height or "timings" not in iterations.columns:
        return pl.DataFrame()
    rows = [{"iteration": i, **json.loads(t)} for i, t in zip(iterations["iteration"], iterations["timings"], strict=True)
            if t]
    return pl.DataFrame(rows).with_columns(pl.exclude("iteration").round(2)) if rows else pl.DataFrame()


def render_run_report(home_dir: str | Path, run_id: str, *, plots: list[Path] | None = None,
                      report_dir: Path | None = None) -> str:
    """Markdown summary of a run from the store. Markdown viewers (MLflow's artifact view among
    them) do not show a relative image, so the plots are named, not linked: ``report.html`` beside
    this file is the same report with the plots embedded."""
    home = Path(home_dir)
    parts = [f"# Run report: {run_id}", "", *_headline(home, run_id), ""]
    if plots:
        names = ", ".join(f"`{(p.relative_to(report_dir) if report_dir and p.is_relative_to(report_dir) else p).as_posix()}`"
                          for p in plots)
        parts += [f"Plots: {names}; with the plots in the page: `report.html` (`trace-rl report {run_id}`).", ""]
    for heading, name, max_rows in _SECTIONS:
        frame = run_named_query(home, name, run_id=run_id)
        shown = frame.drop("timings") if "timings" in frame.columns else frame
        parts += [f"## {heading}", "", f"`trace-rl sql {name} --run-id {run_id}`", "",
                  markdown_table(shown, max_rows), ""]
        if name == "iteration_summary" and (secs := stage_seconds(frame)).height:
            parts += ["Seconds per stage:", "", markdown_table(secs, max_rows), ""]
    return "\n".join(parts)


def publish_run_artifacts(tracker: Tracker, config: BaseModel | Mapping[str, Any] | None = None) -> list[Path]:
    """Write config.yaml, the plots and report.md under ``DIR/runs/{run_id}/artifacts`` and log
    them to the tracker (buffered like everything else). Returns the written files."""
    out = tracker.run_dir / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    if config is not None:
        files.append(tracker.log_text(dump_yaml(config), "config.yaml"))
    plots = write_run_plots(tracker.home_dir, tracker.run_id, out / "plots")
    for p in plots:
        tracker.log_artifact(p, "plots")
    files += plots
    report = render_run_report(tracker.home_dir, tracker.run_id, plots=plots, report_dir=out)
    files.append(tracker.log_text(report, "report.md"))

    page = write_html_report(tracker.home_dir, tracker.run_id, out / "report.html")
    tracker.log_artifact(page)
    files.append(page)
    return files
