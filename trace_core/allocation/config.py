"""Settings of budget allocation (the ``allocation`` section): plain data, no solver imported.

The strategy name is checked once, at start, against the registry in ``strategies``
(``trace_core.runtime.check_names``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Objective = Literal["groups", "trajectories"]
OBJECTIVES: tuple[str, ...] = ("groups", "trajectories")
Stratify = Literal["none", "task", "cell"]


class AllocationConfig(BaseModel):
    """Strategy and budget of one iteration (units: generated trajectories)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str = Field("trace", description="Registered strategy name (trace_core.allocation.strategies).")
    budget_total: int = Field(  # <= 100k: 12x a large GRPO step (512 prompts x 16); 1e9 never finishes
        64, ge=1, le=100_000, description="Trajectories generated per iteration (raw + continuations)."
    )
    budget_tokens: int | None = Field(
        None, ge=1, le=100_000_000,
        description="Equal tokens instead of equal trajectories: generated tokens per iteration. Each "
        "iteration's trajectory budget is then what the tokens still owed (budget_tokens x iterations so far "
        "- tokens generated) buy at the previous iteration's tokens per trajectory (roots, continuations and "
        "refills priced alike, by what they cost), within [0.5, 2] x budget_tokens / that price; "
        "budget_total is iteration 0's. None: budget_total trajectories every iteration.",
    )
    root_share: float | None = Field(
        None, gt=0.0, le=1.0,
        description="Fraction of the budget spent on raw rollouts by strategies with an extension stage. "
        "None: trace spends by one price across roots and continuations (see ext_reserve), the "
        "fixed-split strategies (treepo, trace-root, trace-prefix) use 0.5.",
    )
    ext_reserve: float = Field(
        0.1, ge=0.0, lt=1.0,
        description="trace with root_share None: share of the budget held back from the first root wave "
        "at iteration 0 (later: what the previous iteration bought in continuations, x reserve_slack, "
        "between min_reserve and max_reserve); whatever the prefix stage does not buy goes to a second root wave.",
    )
    reserve_slack: float = Field(
        1.25, ge=1.0, le=10.0,
        description="trace with root_share None, after iteration 0: the reserve is the continuations the "
        "previous iteration bought times this (1.25 = 25% room for the prefix stage to buy more).",
    )
    max_reserve: float = Field(
        0.1, ge=0.0, lt=1.0,
        description="trace with root_share None: the largest reserve share (the first root wave keeps the rest).",
    )
    min_reserve: float = Field(
        0.1, ge=0.0, lt=1.0,
        description="trace with root_share None: the smallest reserve share, so that the prefix stage "
        "keeps being offered continuations to price.",
    )
    dapo_refill: bool = Field(
        True, description="dapo: refill each zero-variance raw group with a fresh prompt's group in a second "
        "wave (dynamic sampling, one round; the extra trajectories and tokens are counted against it).")
    stratify: Stratify = Field(
        "none",
        description="Breadth for the strategies that choose prompts by predicted value (pcl, trace, "
        "trace-root): 'task' splits the iteration's budget across task families, 'cell' across (family, "
        "difficulty) cells, each in proportion to its share of the candidate pool, and the strategy spends "
        "each share within its stratum (roots, continuations and second wave alike). Without it, a family "
        "whose prompts all sit near v = 0.5 can take nearly the whole budget and the others are forgotten. "
        "The uniform strategies take the stream in order (already a mix) either way.",
    )
    group_size: int = Field(8, ge=1, le=4096, description="Rollouts per prompt of the uniform strategies (n).")
    max_per_prompt: int = Field(8, ge=1, le=4096, description="Largest m of TRACE root allocation (M).")
    min_active: int = Field(
        4, ge=1, le=4096, description="Smallest non-zero m: one rollout alone has no contrast."
    )
    max_per_node: int = Field(4, ge=1, le=4096, description="Largest K continuations from one prefix.")
    treepo_branch: int = Field(
        2, ge=1, le=4096, description="Continuations per randomly chosen prefix (treepo, trace-root)."
    )
    min_prob: float = Field(
        0.02, ge=0.0, lt=0.5,
        description="Predicted probabilities are clipped to [min_prob, 1 - min_prob] before allocation: a "
        "predictor is never certain, and exact 0/1 predictions would make every utility zero (no budget spent).",
    )
    token_budget: bool = Field(
        False,
        description="Prefix stage costs continuations by remaining turns: the extension budget (in "
        "whole-episode trajectories) buys more short continuations than long ones.",
    )
    root_objective: Objective = Field(
        "groups",
        description="What TRACE root allocation maximises: 'groups' = expected contrastive groups "
        "(sum V_root(v, m)); 'trajectories' = expected trajectories in them (sum m V_root(v, m)), the "
        "rollouts with a non-zero advantage. Used by trace and trace-root.",
    )
    prefix_objective: Objective = Field(
        "trajectories",
        description="What TRACE prefix allocation maximises: 'groups' = expected branch groups with a "
        "reward flip (sum V_pref(v, r, k)); 'trajectories' = expected trajectories in them (sum (k+1) "
        "V_pref: k continuations plus the raw trajectory). Used by trace and trace-prefix.",
    )

    @model_validator(mode="after")
    def _ranges(self) -> AllocationConfig:
        if self.max_per_prompt < self.min_active:
            raise ValueError(
                f"max_per_prompt ({self.max_per_prompt}) must be >= min_active ({self.min_active})"
            )
        return self
