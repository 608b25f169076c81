"""MLflow tracking for training runs that survives tracking outages.

One MLflow run per training flow run (``compare`` makes a parent run and nested children).
Every call only appends a record to an in-memory buffer; a background thread sends the records,
in order, through an ``MlflowClient``. When the backend is down (server unreachable, SQLite
database locked or unreachable) the thread warns once, keeps the records, and retries with
exponential backoff; training never waits on MLflow except in ``flush``/``finish``, and then
only up to a timeout. Records still unsent at ``finish`` are saved next to the run and replayed
by the next ``Tracker`` for the same run id. Every record is journaled on disk before it is
queued (``tracking.journal``) and replayed unchanged, so a kill -9 loses none and doubles none;
``log_metrics_once`` logs a (group, step) once across sessions; the model is logged once per run.

Resume: the MLflow run id is kept in ``DIR/runs/{run_id}/mlflow_run_id``; a new Tracker with the
same ``run_id`` continues that MLflow run. Steps are explicit (the iteration number), so a
resumed run's metric steps continue where the crashed one stopped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trace_core.config.io import flatten
from trace_core.config.tracking import TrackingConfig
from tracking.journal import Journal, write_atomic
from tracking.registry import send_datasets, send_model
from tracking.sqlite_store import prepare_sqlite_store, rehome_local_store, sqlite_path
from tracking.traces import send_traces

log = logging.getLogger(__name__)

# MLflow's own HTTP retry loop (7 tries, backoff factor 2) would hold a record for minutes;
# this module retries on its own schedule instead. Only defaults: the user's settings win.
_MLFLOW_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
# Errors that retrying cannot fix: drop the record (with a warning) instead of blocking the rest.
_PERMANENT_CODES = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "INVALID_STATE"}
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")
_MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
_PARAMS_PER_BATCH = 100  # MLflow's log_batch limits
_METRICS_PER_BATCH = 1000


def default_tracking_uri(home_dir: str | Path) -> str:
    return f"sqlite:///{Path(home_dir).resolve() / 'mlflow.db'}"


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dict -> ``{"a.b": "value"}`` (``config_io.flatten``) with MLflow-safe keys and
    values (lists as JSON)."""
    out: dict[str, str] = {}
    for name, value in flatten(params, prefix).items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[_BAD_KEY.sub("_", name)] = text[:_MAX_PARAM_CHARS]
    return out


class Tracker:
    """Buffered, outage-tolerant MLflow run for one training run (``run_id``) under ``home_dir``.

    >>> with Tracker(home, "run-1") as tr:
    ...     tr.log_params(config_dict)
    ...     tr.log_metrics({"effective/ratio": 0.52}, step=3)
    """

    def __init__(
        self,
        home_dir: str | Path,
        run_id: str,
        *,
        config: TrackingConfig | None = None,
        parent: Tracker | None = None,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        journal: bool = True,
    ):
        self.home_dir = Path(home_dir)
        self.run_id = run_id
        self.config = config or TrackingConfig()
        self.parent = parent
        self.tracking_uri = self.config.tracking_uri or default_tracking_uri(self.home_dir)
        self.run_dir = self.home_dir / "runs" / run_id
        self._run_name = run_name or run_id
        self._tags = {"trace_rl.run_id": run_id, **(tags or {})}
        self._ops: deque[dict] = deque()
        self._cond = threading.Condition()
        self._busy = False  # a record is being sent
        self._stop = False
        self._wake = False
        self._client = None
        self._mlflow_run_id: str | None = None
        self.experiment_id: str | None = None  # known once the MLflow run is opened
        self.last_error: str | None = None
        self.failures = 0
        self.dropped = 0
        self._thread: threading.Thread | None = None
        # journal=False: a handle on a run another tracker writes (a comparison's parent)
        self._journal = Journal(self.run_dir, enabled=journal)
        if self.config.enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._ops.append({"op": "open"})  # create or resume the MLflow run right away
            self._ops.extend(self._journal.load())
            self._thread = threading.Thread(target=self._worker, name=f"mlflow-{run_id}", daemon=True)
            self._thread.start()

    # ---- public API: every call only buffers -------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = flatten_params(params)
        items = sorted(flat.items())
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self._put({"op": "params", "params": dict(items[i : i + _PARAMS_PER_BATCH])})

    def log_metrics(self, metrics: Mapping[str, float | None], step: int, *, group: str | None = None) -> None:
        """Metrics of one step (the iteration); None values are skipped. With ``group``, the step
        is recorded as logged for that group (``logged_step``) once the records are journaled."""
        values = {_BAD_KEY.sub("_", k): float(v) for k, v in metrics.items() if v is not None}
        items = sorted(values.items())
        ts = int(time.time() * 1000)
        for i in range(0, len(items), _METRICS_PER_BATCH):
            op = {"op": "metrics", "step": int(step), "ts": ts, "values": dict(items[i : i + _METRICS_PER_BATCH])}
            self._put(op if group is None else {**op, "group": group})

    def log_metrics_once(self, metrics: Mapping[str, float | None], step: int, group: str = "",
                         *, floor: int = -1) -> bool:
        """Log the step of ``group`` unless this run (any session) journaled it already, or
        ``step <= floor``; True when logged."""
        if not self.config.enabled or step <= max(floor, self.logged_step(group)):
            return False
        self.log_metrics(metrics, step, group=group)
        return True

    def logged_step(self, group: str = "") -> int:
        """The highest step of ``group`` journaled by any session of this run (-1: none)."""
        return self._journal.steps.get(group, -1)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._put({"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a local file (it must still exist when the record is sent)."""
        self._put({"op": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def log_text(self, text: str, name: str, artifact_path: str | None = None) -> Path:
        """Write ``text`` to ``DIR/runs/{run_id}/artifacts/name`` and upload it."""
        path = self.run_dir / "artifacts" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.log_artifact(path, artifact_path)
        return path

    def log_inputs(self, datasets: list[dict[str, Any]]) -> None:
        """Dataset inputs of the run (``tracking.registry.dataset_records``)."""
        if datasets:
            self._put({"op": "inputs", "datasets": datasets})

    def log_model(self, checkpoint: str | Path, config_path: str | Path, *, registered_model_name: str | None = None,
                  source: str = "") -> None:
        """The policy at ``checkpoint`` (a staged copy of its weights and tokenizer) with the run's
        config as the run's MLflow model, registered under ``registered_model_name`` when given."""
        self._put({"op": "model", "checkpoint": str(Path(checkpoint).resolve()),
                   "config": str(Path(config_path).resolve()), "registered_model_name": registered_model_name,
                   "run": self.run_id, "source": source})

    def log_traces(self, nodes: str | Path, *, cap: int, seed: int, step: int | None = None) -> None:
        """Up to ``cap`` trajectories of the node shard ``nodes`` as MLflow traces of this run
        (``tracking.traces``; the shard must still exist when the record is sent). With ``step``,
        the record counts as that step of the group ``"traces"`` once journaled (``logged_step``):
        the journal sends it whatever stops the process, so nobody waits for MLflow to say so."""
        if cap > 0:
            op = {"op": "traces", "nodes": str(Path(nodes).resolve()), "cap": int(cap), "seed": int(seed)}
            self._put(op if step is None else {**op, "group": "traces", "step": int(step)})

    @property
    def mlflow_run_id(self) -> str | None:
        return self._mlflow_run_id or self._saved_run_id()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._ops) + int(self._busy)

    @property
    def healthy(self) -> bool:
        return self.last_error is None

    def flush(self, timeout: float = 30.0) -> bool:
        """Retry now and wait until every buffered record is sent; False on timeout."""
        if not self.config.enabled:
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            self._wake = True
            self._cond.notify_all()
            while self._ops or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.2))
        return True

    def finish(self, status: str = "FINISHED", timeout: float | None = None) -> bool:
        """End the MLflow run; unsent records are saved for the next Tracker of this run id."""
        if not self.config.enabled or self._thread is None:
            return True
        self._put({"op": "terminate", "status": status})
        ok = self.flush(self.config.finish_timeout_s if timeout is None else timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        self._save_pending()
        self._thread = None
        return ok

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish("FAILED" if exc_type else "FINISHED")

    # ---- buffer -------------------------------------------------------------------------
    def _put(self, op: dict) -> None:
        if not self.config.enabled:
            return
        with self._cond:
            if len(self._ops) >= self.config.max_buffer:
                self._evict_one()
            self._ops.append(self._journal.append(op))  # on disk before it is queued
            self._cond.notify_all()

    def _evict_one(self) -> None:
        for i, op in enumerate(self._ops):
            if op["op"] == "metrics":
                del self._ops[i]
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("MLflow buffer full (%d records): dropping the oldest metrics", self.config.max_buffer)
                return

    def _save_pending(self) -> None:
        with self._cond:
            ops = [op for op in self._ops if op["op"] != "terminate"]
        if not ops:
            self._journal.done()
            return
        self._journal.rewrite(ops)
        log.warning("MLflow unreachable: %d records saved to %s for the next session", len(ops), self._journal.path)

    # ---- worker thread ------------------------------------------------------------------
    def _worker(self) -> None:
        backoff = self.config.retry_initial_s
        while True:
            with self._cond:
                while not self._ops and not self._stop:
                    self._cond.wait()
                if not self._ops:  # stopping and nothing left
                    return
                op = self._ops[0]
                self._busy = True
            interrupted = False
            try:
                self._ensure_run()
                self._send(op)
                failed, permanent = None, False
            except KeyboardInterrupt as err:
                # not a tracking failure: a SIGINT that stops the run can surface here too, raised
                # inside a polars query (polars aborts its queries on KeyboardInterrupt); the main
                # thread handles the stop; the record stays queued, is retried, and is journalled
                # if the run ends first
                failed, permanent, interrupted = err, False, True
            except Exception as err:  # noqa: BLE001 - any tracking failure must not escape
                failed, permanent = err, _is_permanent(err)
            with self._cond:
                self._busy = False
                if failed is None or permanent:
                    self._journal.sent(op)
                    if self._ops and self._ops[0] is op:
                        self._ops.popleft()
                    self._cond.notify_all()
                if failed is None:
                    if self.last_error is not None:
                        log.warning("MLflow is back after %d failed attempts; sending buffered records", self.failures)
                    self.last_error, self.failures, backoff = None, 0, self.config.retry_initial_s
                    continue
                if permanent:
                    log.warning("MLflow rejected a %s record, dropped: %s", op["op"], _short(failed))
                    continue
                if interrupted:  # retried like a transient failure, but neither counted nor warned about
                    log.debug("MLflow %s record interrupted by a stop signal; kept for a retry", op["op"])
                else:
                    self.failures += 1
                    if self.last_error is None:
                        log.warning("MLflow unavailable (%s); buffering and retrying (%d records pending)",
                                    _short(failed), len(self._ops))
                    self.last_error = _short(failed)
                if self._stop:
                    return
                self._wake = False
                self._cond.wait_for(lambda: self._wake or self._stop, timeout=backoff)
                if not interrupted:
                    backoff = min(backoff * 2, self.config.retry_max_s)

    def _ensure_run(self) -> None:
        if self._client is None:
            for key, value in _MLFLOW_ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
            from mlflow import MlflowClient  # imported here: ~seconds, off the training thread

            db = sqlite_path(self.tracking_uri)
            if db is not None:  # made whole or not at all: a crash cannot leave it half-migrated
                prepare_sqlite_store(db)
            if self.config.tracking_uri is None:
                rehome_local_store(self.home_dir)
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        if self._mlflow_run_id is not None:
            return
        saved = self._saved_run_id()
        if saved is not None and self._resume(saved):
            self._mlflow_run_id = saved
            return
        tags = dict(self._tags)
        if self.parent is not None:
            parent_id = self.parent.mlflow_run_id
            if parent_id is None:
                raise RuntimeError("parent MLflow run not created yet")
            tags["mlflow.parentRunId"] = parent_id
        run = self._client.create_run(self._experiment_id(), run_name=self._run_name, tags=tags)
        self._mlflow_run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        write_atomic(self.run_dir / "mlflow_run_id", run.info.run_id)

    def _resume(self, mlflow_run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(mlflow_run_id)
        except MlflowException as err:
            if getattr(err, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.warning("MLflow run %s of %s is not in %s; starting a new one", mlflow_run_id, self.run_id,
                        self.tracking_uri)
            return False
        if run.info.status != "RUNNING":
            self._client.update_run(mlflow_run_id, status="RUNNING")
        self.experiment_id = run.info.experiment_id
        return True

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self._client.get_experiment_by_name(self.config.experiment)
        if exp is not None:
            return exp.experiment_id
        location = None
        if self.config.tracking_uri is None:  # local backend: keep artifacts under DIR as well
            location = (self.home_dir.resolve() / "mlartifacts").as_uri()
        try:
            return self._client.create_experiment(self.config.experiment, artifact_location=location)
        except MlflowException:  # created by another run meanwhile
            return self._client.get_experiment_by_name(self.config.experiment).experiment_id

    def _saved_run_id(self) -> str | None:
        try:
            text = (self.run_dir / "mlflow_run_id").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return text if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text) else None

    def _send(self, op: dict) -> None:
        from mlflow.entities import Metric, Param, RunTag

        rid, kind = self._mlflow_run_id, op["op"]
        if kind == "open":
            return
        if kind == "params":
            self._client.log_batch(rid, params=[Param(k, v) for k, v in op["params"].items()])
        elif kind == "metrics":
            metrics = [Metric(k, v, op["ts"], op["step"]) for k, v in op["values"].items() if math.isfinite(v)]
            self._client.log_batch(rid, metrics=metrics)
        elif kind == "tags":
            self._client.log_batch(rid, tags=[RunTag(k, v) for k, v in op["tags"].items()])
        elif kind == "artifact":
            self._client.log_artifact(rid, op["path"], op.get("artifact_path"))
        elif kind == "inputs":
            send_datasets(self._client, rid, op["datasets"])
        elif kind == "traces":
            send_traces(self.tracking_uri, rid, self.experiment_id, op)
        elif kind == "model":
            send_model(self._client, self.tracking_uri, rid, op)
        elif kind == "terminate":
            self._client.set_terminated(rid, status=op["status"])
        else:
            raise ValueError(f"unknown tracking record {kind!r}")


def _is_permanent(err: Exception) -> bool:
    if isinstance(err, FileNotFoundError | ValueError) and not _is_mlflow(err):
        return True
    return getattr(err, "error_code", None) in _PERMANENT_CODES


def _is_mlflow(err: Exception) -> bool:
    return type(err).__module__.startswith("mlflow")


def _short(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"

