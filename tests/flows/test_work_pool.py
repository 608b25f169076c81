"""The deployment in prefect.yaml, run the way a GPU machine runs it: a real `prefect server`, the
process work pool `gpu-pool`, `prefect deploy --all` from the repository root, and a worker that
picks up one run of `tiny-nightly` (small CI config, one iteration, no held-out evaluation) and
executes it in a subprocess.

Everything goes through the `prefect` command line and the server's REST API, in processes with
their own PREFECT_HOME, so nothing leaks into (or from) the in-process test harness."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from trace_core.policy.model import TINY_WARM_DIR

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
DEPLOYMENT = "trace-train-scheduled/tiny-nightly"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (TINY_WARM_DIR / "config.json").is_file(),
                                 reason="shipped tiny checkpoint missing: run `trace-rl warmup`")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(state: Path, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PREFECT_HOME": str(state / "prefect"), "XDG_CONFIG_HOME": str(state / "xdg"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_LOGGING_LEVEL": "INFO",
        # the nightly cron must not race the run we trigger for the worker's single poll
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        # the pull step of prefect.yaml changes into the worker's checkout
        "TRACE_RL_CHECKOUT": str(ROOT),
    })
    return env


def _cli(env: dict, *args: str, timeout: float = 120) -> str:
    out = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"prefect {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _start(env: dict, args: list[str], log: Path) -> subprocess.Popen:
    # own session = own process group, so the cleanup reaches the flow-run subprocesses too
    return subprocess.Popen([PREFECT, *args], env=env, cwd=ROOT, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _wait_healthy(api: str, server: subprocess.Popen, log: Path, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"prefect server exited:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"prefect server not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


def test_tiny_deployment_runs_on_process_pool(tmp_path):
    port = _free_port()
    env = _env(tmp_path, port)
    api = env["PREFECT_API_URL"]
    home = tmp_path / "home"
    procs: list[subprocess.Popen] = []
    try:
        server_log = tmp_path / "server.log"
        procs.append(_start(env, ["server", "start", "--host", "127.0.0.1", "--port", str(port)], server_log))
        _wait_healthy(api, procs[0], server_log)

        _cli(env, "work-pool", "create", "gpu-pool", "--type", "process")
        _cli(env, "--no-prompt", "deploy", "--all")
        deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
        by_name = {d["name"]: d for d in deps}
        assert set(by_name) == {"tiny-nightly", "qwen3-8b-weekly"}
        nightly = by_name["tiny-nightly"]
        assert nightly["work_pool_name"] == "gpu-pool"
        assert [s["schedule"]["cron"] for s in nightly["schedules"]] == ["0 2 * * *"]
        assert nightly["entrypoint"] == "flows/train.py:scheduled_train"

        params = {"config_path": "configs/small-ci.yaml", "run_id": "pool", "home": str(home),
                  "overrides": ["run.iterations=1", "run.eval_tasks=0", "run.threads=1"]}
        out = _cli(env, "deployment", "run", DEPLOYMENT, "--params", json.dumps(params))
        flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)

        worker_log = tmp_path / "worker.log"
        worker = _start(env, ["worker", "start", "--pool", "gpu-pool", "--run-once"], worker_log)
        procs.append(worker)
        # --run-once: one poll, then the worker waits for the flow-run subprocess it started
        worker.wait(timeout=240)

        run = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=10).json()
        assert run["state"]["type"] == "COMPLETED", f"{run['state']}\n{worker_log.read_text()[-4000:]}"
        assert run["work_pool_name"] == "gpu-pool"
        children = httpx.post(f"{api}/flow_runs/filter", timeout=10, json={
            "flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}}).json()
        assert children and all(c["state"]["type"] == "COMPLETED" for c in children)
        shards = list((home / "shards" / "nodes" / "run_id=pool").rglob("*.parquet"))
        assert shards, f"no node shards under {home}"
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_the_ray_deployments_join_a_token_authenticated_cluster():
    """Ray 2.60's `ray start --head` turns token authentication on; a flow joining it through
    RAY_ADDRESS is refused (InvalidAuthToken) unless its environment asks for token mode too (found
    by scripts/rehearsal.py, which runs qwen3-8b-weekly against such a head)."""
    import yaml

    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    joining = [d for d in deployments if "RAY_ADDRESS" in d["work_pool"]["job_variables"].get("env", {})]
    assert [d["name"] for d in joining] == ["qwen3-8b-weekly"]
    for d in joining:
        assert d["work_pool"]["job_variables"]["env"].get("RAY_AUTH_MODE") == "token", d["name"]
