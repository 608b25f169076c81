"""MLflow tracking of trace-rl runs: the outage-tolerant ``Tracker``, plots and the run report.

Kept outside ``trace_core`` so the library never imports MLflow; flows import this package.
"""

from tracking.mlflow_tracker import Tracker, TrackingConfig, default_tracking_uri, flatten_params
from tracking.report import publish_run_artifacts, render_run_report

__all__ = [
    "Tracker",
    "TrackingConfig",
    "default_tracking_uri",
    "flatten_params",
    "publish_run_artifacts",
    "render_run_report",
]
