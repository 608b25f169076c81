"""The links the operator follows: git commit of the checkout, MLflow run URL, Prefect markdown."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trace_core.stages.results import IterationTiming
from tracking.links import git_state, mlflow_link_markdown, mlflow_run_url
from tracking.run_tracker import accuracy_metrics, wall_metrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_git_state_of_this_checkout():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    state = git_state(ROOT)
    assert state["mlflow.source.git.commit"] == head
    assert state["trace_rl.git_dirty"] in {"true", "false"}


def test_no_git_state_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) == {}


def test_mlflow_run_url_only_for_a_server():
    assert mlflow_run_url("http://mlflow:5000/", "3", "abc") == "http://mlflow:5000/#/experiments/3/runs/abc"
    assert mlflow_run_url("sqlite:////h/mlflow.db", "3", "abc") is None
    assert mlflow_run_url("http://mlflow:5000", None, None) is None
    md = mlflow_link_markdown("r1", {"run_id": "abc", "experiment_id": "3", "tracking_uri": "sqlite:////h/mlflow.db",
                                     "url": None, "git_commit": "f" * 40})
    assert "`abc`" in md and "mlflow ui --backend-store-uri sqlite:////h/mlflow.db" in md and "f" * 40 in md


def test_grouped_metric_names():
    assert accuracy_metrics({"accuracy": 0.5, "accuracy_math": 0.7, "accuracy_qa": None, "tokens": 3}) == {
        "accuracy/all": 0.5, "accuracy/math": 0.7}
    timing = IterationTiming(stages={"verified": 0.25, "update": 2.25}, evaluate_s=1.0, iteration_s=4.0)
    assert wall_metrics(timing) == {"time/iteration_s": 4.0, "time/overhead_s": 0.5, "time/overhead_share": 0.125,
                                    "time/evaluate_s": 1.0}  # stage seconds are logged with the stages
