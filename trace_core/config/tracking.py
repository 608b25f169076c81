"""Where and how a run is tracked (the ``tracking`` section of the run config). Pure
configuration: the MLflow client that uses it lives in the top-level ``tracking`` package."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrackingConfig(BaseModel):
    """Where and how a run is tracked."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Track in MLflow at all (False: every call is a no-op).")
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI (e.g. http://host:5000); None = sqlite:///DIR/mlflow.db."
    )
    experiment: str = Field("trace-rl", min_length=1, description="MLflow experiment name.")
    retry_initial_s: float = Field(0.5, gt=0, le=60, description="First wait after a failed send.")
    retry_max_s: float = Field(30.0, gt=0, le=3600, description="Longest wait between retries (doubling).")
    finish_timeout_s: float = Field(
        30.0, ge=0, le=3600, description="How long finish() waits for buffered records before saving them."
    )
    max_buffer: int = Field(
        200_000, ge=100, le=10_000_000, description="Records kept during an outage; the oldest metrics go first."
    )
    log_model: bool = Field(
        True, description="Log the final checkpoint (weights, tokenizer, the run's config) as the run's MLflow "
        "model 'policy' (a pyfunc model from code: tracking/policy_model.py).")
    trace_samples: int = Field(
        8, ge=0, le=10_000, description="Trajectories per iteration logged as MLflow traces (a span per agent turn, "
        "the reward as the trace's assessment), drawn with the run's seed; 0 = none.")
    registered_model_name: str | None = Field(
        None, min_length=1, max_length=256,
        description="Register the logged model under this name in the MLflow model registry (None = not registered).")
