"""The last lines `trace-rl train` prints: what the run did, and where the store, the report, the
MLflow run and the Prefect flow run are (the markdown report itself is an MLflow artifact)."""

from __future__ import annotations

from pathlib import Path


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _uniform(summary: dict) -> str:
    """What uniform GRPO would have had on the same candidates (an upper bound; analysis.outcome)."""
    u = summary.get("uniform_effective_ratio")
    if u is None:
        return ""
    return f" (uniform GRPO, groups of {summary.get('group_size')}, on the same candidates: at most {u:.1%} expected)"


def _change(summary: dict) -> str:
    """The paired change with its 95% interval, and whether the evaluation can tell it from noise."""
    change = summary.get("accuracy_change")
    if not change:
        return ""
    mean, half, prompts = change
    lo, hi = 100 * (mean - half), 100 * (mean + half)
    verdict = ("a real change" if lo > 0 or hi < 0 else
               "not distinguishable from no change at this evaluation size (run.eval_tasks)")
    return (f": {100 * mean:+.1f} points (95% CI {lo:+.1f} to {hi:+.1f}, paired over {prompts} prompts"
            f" x {summary.get('eval_samples', '?')} samples; {verdict})")


def where_lines(summary: dict, *, temporary_server: bool) -> list[str]:
    """A few lines: the outcome (effective ratio against uniform GRPO's, the held-out change with its
    uncertainty), then one line each for the store, the report, MLflow, Prefect and what to run next."""
    run, home = summary["run_id"], Path(summary["home"])
    rows = summary.get("iterations") or []
    acc = [r.get("accuracy") for r in rows if r.get("accuracy") is not None]
    before = summary.get("accuracy_before")
    lines = [f"run {run}: {len(rows)} iterations, effective ratio {_pct(rows[0]['effective_ratio']) if rows else '-'}"
             f" → {_pct(rows[-1]['effective_ratio']) if rows else '-'}" + _uniform(summary)]
    lines.append(f"held-out accuracy {_pct(before)} → {_pct(acc[-1] if acc else None)}" + _change(summary))
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
    lines.append(f"next:    trace-rl sql wasted_by_task --run-id {run} --home {home}  (where rollouts taught nothing); "
                 "trace-rl compare --strategies grpo,trace --seeds 3  (held-out accuracy against tokens, with CIs)")
    return lines
