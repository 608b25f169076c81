"""The tracker's write-ahead journal: every tracking record is on disk before it is sent, so a
record is sent at least once whatever stops the process; records are replayed unchanged (same
timestamp, same value), and MLflow stores an identical metric only once, so a replay never
doubles a (key, step).

Files in ``DIR/runs/{run_id}/``:

* ``mlflow_pending.jsonl``: one JSON record a line, each with a sequence number ``seq``, appended
  and fsynced before the record is queued. A torn last line (killed mid-write, full disk) is
  skipped when read.
* ``mlflow_sent``: the highest ``seq`` sent (written atomically after each send).
* ``mlflow_steps.json``: per metric group, the highest step journaled (``log_metrics_once``),
  so a resumed run never logs a step again, even after its journal was compacted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def write_atomic(path: Path, text: str) -> None:
    """``text`` at ``path`` or the old content: written to a unique temporary name, fsynced, renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def read_int(path: Path, default: int = -1) -> int:
    """An integer marker file; missing, empty or garbled (an older writer's torn write) -> ``default``."""
    try:
        return int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        if path.exists():
            log.warning("%s is unreadable or empty; treating it as unset", path)
        return default


class Journal:
    """The records of one tracker, on disk (``enabled=False``: in memory only)."""

    def __init__(self, run_dir: Path, *, enabled: bool = True):
        self.run_dir = run_dir
        self.enabled = enabled
        self.path = run_dir / "mlflow_pending.jsonl"
        self.sent_path = run_dir / "mlflow_sent"
        self.steps_path = run_dir / "mlflow_steps.json"
        self.steps: dict[str, int] = {}
        self._seq = 0
        self.failed = False  # a write failed (full disk): records are kept in memory only

    def load(self) -> list[dict]:
        """The unsent records of earlier sessions (the journal is compacted to them)."""
        if not self.enabled:
            return []
        self.steps = self._read_steps()
        ops = _read_lines(self.path)
        sent = read_int(self.sent_path)
        for op in ops:
            if op.get("group") is not None:
                self.steps[op["group"]] = max(self.steps.get(op["group"], -1), int(op["step"]))
        self._seq = max([sent, *(int(op.get("seq", -1)) for op in ops)]) + 1
        unsent = []
        for op in ops:
            if op.get("op") in ("open", "terminate"):  # the run goes on
                continue
            if "seq" not in op:  # an older session's record: send it now
                op["seq"] = self._seq
                self._seq += 1
            if op["seq"] > sent:
                unsent.append(op)
        try:
            write_atomic(self.steps_path, json.dumps(self.steps))  # before compaction drops their records
            if ops:
                write_atomic(self.path, "".join(json.dumps(op) + "\n" for op in unsent))
        except OSError as err:
            self._failed(err)
        if unsent:
            log.info("replaying %d MLflow records left by an earlier session of %s", len(unsent), self.run_dir.name)
        return unsent

    def append(self, op: dict) -> dict:
        """Number ``op`` and put it on disk (fsynced) before it is queued."""
        op["seq"] = self._seq
        self._seq += 1
        if self.enabled and op["op"] != "terminate":
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(op) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as err:
                self._failed(err)
                return op
            if op.get("group") is not None:
                self.steps[op["group"]] = max(self.steps.get(op["group"], -1), op["step"])
                with contextlib.suppress(OSError):
                    write_atomic(self.steps_path, json.dumps(self.steps))
        return op

    def sent(self, op: dict) -> None:
        if self.enabled and "seq" in op:
            try:
                write_atomic(self.sent_path, str(op["seq"]))
            except OSError as err:
                self._failed(err)

    def done(self) -> None:
        """Every record sent: the journal is emptied (the step marks stay)."""
        if self.enabled:
            for p in (self.path, self.sent_path):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()

    def rewrite(self, ops: list[dict]) -> None:
        """Unsent records at the end of a session (a journal write failed earlier: keep what is left)."""
        if self.enabled and ops:
            try:
                write_atomic(self.path, "".join(json.dumps(op) + "\n" for op in ops if op["op"] not in ("open", "terminate")))
            except OSError as err:
                self._failed(err)

    def _read_steps(self) -> dict[str, int]:
        try:
            data = json.loads(self.steps_path.read_text(encoding="utf-8"))
            return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, UnicodeDecodeError, AttributeError):
            log.warning("%s is unreadable; step marks rebuilt from the journal", self.steps_path)
            return {}

    def _failed(self, err: OSError) -> None:
        if not self.failed:
            log.warning("tracking journal %s not written (%s): records kept in memory only", self.path, err)
        self.failed = True


def _read_lines(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    ops = []
    for line in text.splitlines():
        try:
            op = json.loads(line)
        except ValueError:  # a torn line: the process died while writing it
            continue
        if isinstance(op, dict) and isinstance(op.get("op"), str):
            ops.append(op)
    return ops
