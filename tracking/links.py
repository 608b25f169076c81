"""What ties a run's records together for the operator: the git commit the code ran from, the
Prefect flow run that drove it and the MLflow run that holds its metrics (each UI links to the
other). MLflow tags written here:

    mlflow.source.git.commit    HEAD of the checkout the code runs from (shown by the MLflow UI)
    trace_rl.git_dirty          "true" when tracked files differ from that commit
    prefect.flow_run_id         the Prefect flow run that last wrote the run (a resume is a new one)
    prefect.flow_run_url        its page in the Prefect UI, when a Prefect server is configured
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from trace_core.home.run_row import git, git_commit

_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_CHECKOUT = Path(__file__).resolve().parents[1]


@functools.cache
def git_state(checkout: Path = _CHECKOUT) -> dict[str, str]:
    """``{"mlflow.source.git.commit": sha, "trace_rl.git_dirty": "true"|"false"}`` for the git
    checkout at ``checkout`` (default: the one this code runs from); ``{}`` outside a checkout."""
    sha = git_commit(checkout)  # the commit the `runs` view records too
    if sha is None or not _SHA.fullmatch(sha):
        return {}
    status = git("status", "--porcelain", "--untracked-files=no", directory=checkout)
    tags = {"mlflow.source.git.commit": sha}
    if status is not None and status.returncode == 0:
        tags["trace_rl.git_dirty"] = "true" if status.stdout.strip() else "false"
    return tags


def mlflow_run_url(tracking_uri: str, experiment_id: str | None, run_id: str | None) -> str | None:
    """The run's page in the MLflow UI of an http(s) tracking server; None for a local backend
    (SQLite, files: open it with ``mlflow ui --backend-store-uri URI``)."""
    if not (experiment_id and run_id and tracking_uri.startswith(("http://", "https://"))):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def mlflow_link_markdown(run_id: str, link: dict[str, str | None]) -> str:
    """Markdown for the Prefect UI: which MLflow run holds this run's metrics and how to open it."""
    lines = [f"### MLflow run of {run_id}", "", "| | |", "|---|---|",
             f"| MLflow run id | `{link.get('run_id') or 'not created yet (tracking unreachable)'}` |",
             f"| experiment id | `{link.get('experiment_id') or '-'}` |",
             f"| tracking URI | `{link.get('tracking_uri')}` |"]
    if link.get("url"):
        lines.append(f"| open | [{link['url']}]({link['url']}) |")
    else:
        lines.append(f"| open | `mlflow ui --backend-store-uri {link.get('tracking_uri')}` |")
    if link.get("git_commit"):
        lines.append(f"| git commit | `{link['git_commit']}` |")
    return "\n".join(lines)
