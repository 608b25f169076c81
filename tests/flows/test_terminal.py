"""What a fresh `trace-rl train` (no --run-id, its own temporary Prefect server) shows in the
terminal: the run id from the first line, the flow's own progress lines only, and a few last
lines that say where everything went."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                                   reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("terminal")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "HF_HUB_"))}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp / "prefect"), MLFLOW_DISABLE_TELEMETRY="true",
               DO_NOT_TRACK="true", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    home = tmp / "home"
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs" / "small-ci.yaml"),
                           "--set", "run.iterations=1", "--set", "run.threads=1", "--home", str(home)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home, proc.stdout, proc.stderr


def test_the_run_is_named_by_its_id_from_the_first_line(fresh_run):
    """Without --run-id the flow run and the first task run carry the generated run id."""
    home, _, err = fresh_run
    (run,) = [p.name for p in (home / "runs").iterdir()]
    assert re.fullmatch(r"trace-\d{8}-\d{6}-[0-9a-f]{6}", run)
    assert "new-run" not in err
    first = next(line for line in err.splitlines() if "Flow run '" in line)
    assert f"Flow run '{run}'" in first, first
    assert f"Task run 'evaluate {run} before training'" in err


def test_the_terminal_holds_only_the_runs_own_lines(fresh_run):
    """No third-party progress bars or MLflow warnings; the held-out evaluation reports
    itself; stdout ends with a few lines: the outcome (effective ratio against uniform GRPO's, the
    held-out change with its paired interval), the store, the report, MLflow, Prefect, what next."""
    home, out, err = fresh_run
    for noise in ("Loading weights", "Writing model shards", "Downloading artifacts", "UserWarning",
                  "Creating initial MLflow database tables", "it/s]"):
        assert noise not in err, noise
    assert "held-out evaluation before training: 12 prompts x 1 samples" in err
    assert re.search(r"held-out accuracy before training: \d+\.\d% over 12 episodes", err)
    lines = out.strip().splitlines()
    assert len(lines) <= 7, out
    (run,) = [p.name for p in (home / "runs").iterdir()]
    text = "\n".join(lines)
    assert lines[0].startswith(f"run {run}: 1 iterations, effective ratio ")
    assert "(uniform GRPO, groups of " in lines[0] and "on the same candidates: at most " in lines[0]
    # the held-out change with its uncertainty: paired per prompt over the 12 held-out prompts
    assert re.search(r"^held-out accuracy \d+\.\d% → \d+\.\d%: [+-]\d+\.\d points \(95% CI [+-]\d+\.\d to "
                     r"[+-]\d+\.\d, paired over 12 prompts x 1 samples; ", lines[1]), lines[1]
    assert lines[-1].startswith("next:    trace-rl sql wasted_by_task")
    assert f"store:   {home}" in text and f"trace-rl report {run} --home {home}" in text
    assert str(home / "runs" / run / "artifacts" / "report.md") in text
    assert f"sqlite:///{home / 'mlflow.db'}" in text and "mlflow ui --backend-store-uri" in text
    assert "temporary server" in text and "prefect server start" in text
