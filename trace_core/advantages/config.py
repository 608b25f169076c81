"""Settings of the advantage estimator (the ``advantage`` section): plain data, no estimator imported.

The estimator name is checked once, at start, against the registry in ``trace_core.advantages.estimators``
(``trace_core.runtime.check_names``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdvantageConfig(BaseModel):
    """Which estimator turns rewards into per-turn advantages."""

    model_config = ConfigDict(extra="forbid")

    estimator: str = Field("tree", description="Registered estimator name ('tree' default for branched trees, 'grpo').")
    scale_std: bool = Field(False, description="Divide by the group's reward std (population std, + eps); "
                            "off by default (Dr. GRPO: std scaling over-weights near-uniform groups).")
    eps: float = Field(1e-6, gt=0, le=1.0, description="Added to the std before dividing.")
