"""The last lines `trace-rl train` prints: what the run did, and where the store, the report, the
MLflow run and the Prefect flow run are (the markdown report itself is an MLflow artifact)."""

from __future__ import annotations

from pathlib import Path


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def where_lines(summary: dict, *, temporary_server: bool) -> list[str]:
    """A few lines: the outcome, then one line each for the store, the report, MLflow and Prefect."""
    run, home = summary["run_id"], Path(summary["home"])
    rows = summary.get("iterations") or []
    acc = [r.get("accuracy") for r in rows if r.get("accuracy") is not None]
    before = summary.get("accuracy_before")
    lines = [f"run {run}: {len(rows)} iterations, effective ratio {_pct(rows[0]['effective_ratio']) if rows else '-'}"
             f" → {_pct(rows[-1]['effective_ratio']) if rows else '-'}, held-out accuracy {_pct(before)} → "
             f"{_pct(acc[-1] if acc else None)}"]
    lines.append(f"store:   {home}  (trace-rl sql iteration_summary --run-id {run} --home {home})")
    lines.append(f"report:  {summary['report_path']}  (as HTML: trace-rl report {run} --home {home})"
                 if summary.get("report_path") else f"report:  trace-rl report {run} --home {home}")
    link = summary.get("mlflow") or {}
    uri = link.get("tracking_uri") or ""
    if link.get("url"):
        lines.append(f"MLflow:  {link['url']}")
    else:
        lines.append(f"MLflow:  run {link.get('run_id') or '?'} in {uri}  (mlflow ui --backend-store-uri {uri})")
    if temporary_server:
        lines.append("Prefect: the temporary server (and its 'View at' links above) stopped with the run; to keep "
                     "the UI: prefect server start, export PREFECT_API_URL=http://127.0.0.1:4200/api")
    return lines
