"""Settings of the advantage estimator (the ``advantage`` section): pure pydantic.

The estimator name is checked against the registry in ``trace_core.advantages.estimators`` lazily, when a
config is built.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class AdvantageConfig(BaseModel):
    """Which estimator turns rewards into per-turn advantages."""

    model_config = ConfigDict(extra="forbid")

    estimator: str = Field("tree", description="Registered estimator name ('tree' default for branched trees, 'grpo').")
    value: Literal["leaves", "children"] = Field(
        "leaves", description="A node's value: 'leaves' = the mean reward of every leaf below it; 'children' = "
        "the mean of its children's values (a leaf: its reward), so a branched child counts once, like "
        "every other sample from that node, and a root group's baseline is not pulled toward the "
        "subtree the budget branched. Equal on unbranched trees.")
    scale_std: bool = Field(False, description="Divide by the group's reward std (population std, + eps); "
                            "off by default (Dr. GRPO: std scaling over-weights near-uniform groups).")
    eps: float = Field(1e-6, gt=0, le=1.0, description="Added to the std before dividing.")

    @field_validator("estimator")
    @classmethod
    def _registered(cls, v: str) -> str:
        from trace_core.advantages.estimators import get_adv_est  # lazy: the config imports no estimator

        try:
            get_adv_est(v)
        except KeyError as e:  # the registry's message lists the known names
            raise ValueError(e.args[0]) from None
        return v
