"""Environment configuration (one pydantic model): task mix, episode limits, tool options."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trace_core.envs.families import ENVS


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    families: dict[str, float] = Field(
        default_factory=lambda: {"math": 1.0, "qa": 1.0, "fc": 1.0},
        description="Mix weights of the task families in the candidate pool (need not sum to 1).",
    )
    difficulties: list[int] = Field(
        default_factory=lambda: [0, 1, 2, 3],
        description="Synthetic difficulty levels drawn (uniformly) for the candidate pool; 0 = easiest.",
    )
    max_turns: int = Field(8, ge=1, le=64, description="Assistant turns per episode before 'turn_limit'.")
    max_tokens_per_episode: int = Field(
        1024, ge=16, le=131072, description="Action + observation tokens per episode before 'token_limit'."
    )
    max_action_chars: int = Field(
        16384, ge=64, le=1_000_000, description="A longer assistant turn ends with 'action_too_long', unparsed."
    )
    max_observation_chars: int = Field(600, ge=32, le=100_000, description="Tool output is truncated to this.")
    prompt_style: Literal["compact", "full"] = Field(
        "compact",
        description="'compact': one line 'tools: f(a, b)' (tiny models); 'full': Qwen3 JSON tool schemas.",
    )
    search_top_k: int = Field(2, ge=1, le=20, description="Paragraphs the QA search tool returns.")
    tool_timeout_s: float = Field(1.0, gt=0.0, le=60.0, description="Wall-clock limit of one tool call.")
    partial_credit: bool = Field(
        False,
        description="Graded rewards where defined (QA: token F1; FC: share of matched calls). Default 0/1.",
    )
    on_malformed: Literal["end", "observe"] = Field(
        "end",
        description="Malformed action / unknown tool: 'end' the episode with reward 0, or 'observe' an "
        "error message and continue (the turn still counts).",
    )

    @field_validator("families")
    @classmethod
    def _known_families(cls, v: dict[str, float]) -> dict[str, float]:
        known = ENVS.names()  # the registered families (each family package registers its env)
        bad = {k: w for k, w in v.items() if k not in known or w < 0}
        if bad or not any(w > 0 for w in v.values()):
            raise ValueError(f"families must map {known} to weights >= 0, one > 0; got {v}")
        return v

    @field_validator("difficulties")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v or any(d not in (0, 1, 2, 3) for d in v):
            raise ValueError(f"difficulties must be a non-empty subset of 0..3; got {v}")
        return v
