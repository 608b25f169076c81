"""RunTracker writes each (key, step) once across crashes: a resumed process skips the steps
its predecessor sent, for the iteration metrics and for the wall times logged after them. A stand-in for the MLflow Tracker, on the real journal, records what would be sent."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import tracking.run_tracker as rt
from trace_core.config import load_train_config
from trace_core.stages.run import RunRef
from tracking.journal import Journal

ROOT = Path(__file__).resolve().parents[2]


class SentMetrics:
    """Tracker stand-in: every metric sent, as (key, step), shared by the 'processes'."""

    sent: Counter = Counter()

    def __init__(self, home_dir, run_id, **_):
        self.run_dir = Path(home_dir) / "runs" / run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(self.run_dir)
        self.journal.load()

    def log_params(self, params):
        pass

    def set_tags(self, tags):
        pass

    def log_metrics_once(self, metrics, step, group="", *, floor=-1):
        if step <= max(floor, self.journal.steps.get(group, -1)):
            return False
        self.journal.append({"op": "metrics", "step": step, "group": group, "values": dict(metrics)})
        SentMetrics.sent.update((k, step) for k in metrics)
        return True

    def flush(self, timeout):
        return True


@pytest.fixture
def tracker_cls(monkeypatch):
    SentMetrics.sent = Counter()
    monkeypatch.setattr(rt, "Tracker", SentMetrics)
    return SentMetrics


def test_wall_metrics_once_per_step_after_a_crash(tmp_path, tracker_cls):
    cfg = load_train_config(ROOT / "configs" / "small-ci.yaml", [])
    ref = RunRef(str(tmp_path), "r")
    first = rt.RunTracker(ref, cfg)
    first.log({"effective_ratio": 0.5}, step=1)
    first.log({"wall_iteration_s": 3.0}, step=1, group="wall")
    # kill -9 here; the resumed process replays iteration 0 and logs its step again
    resumed = rt.RunTracker(ref, cfg)
    resumed.log({"effective_ratio": 0.5}, step=1)
    resumed.log({"wall_iteration_s": 2.0}, step=1, group="wall")
    resumed.log({"effective_ratio": 0.6}, step=2)
    resumed.log({"wall_iteration_s": 4.0}, step=2, group="wall")
    assert tracker_cls.sent == {("effective_ratio", 1): 1, ("wall_iteration_s", 1): 1,
                                ("effective_ratio", 2): 1, ("wall_iteration_s", 2): 1}


def test_crash_between_metrics_and_wall_still_logs_wall(tmp_path, tracker_cls):
    cfg = load_train_config(ROOT / "configs" / "small-ci.yaml", [])
    ref = RunRef(str(tmp_path), "r")
    rt.RunTracker(ref, cfg).log({"effective_ratio": 0.5}, step=1)
    # killed before the wall times of step 1 were logged
    resumed = rt.RunTracker(ref, cfg)
    resumed.log({"effective_ratio": 0.5}, step=1)
    resumed.log({"wall_iteration_s": 2.0}, step=1, group="wall")
    assert tracker_cls.sent == {("effective_ratio", 1): 1, ("wall_iteration_s", 1): 1}
