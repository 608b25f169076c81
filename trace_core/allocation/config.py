"""Settings of budget allocation (the ``allocation`` section): plain data, no solver imported.

Design: what every strategy reads sits at the top of the section; what only some strategies read
sits in one small section per strategy, named after it (``trace-root`` -> ``trace_root``)::

    allocation:
      strategy: trace        # the strategy `train` runs; `compare --strategies` runs each one named
      budget_total: 192      # shared: every strategy spends the same budget
      group_size: 8
      trace:                 # read only when trace runs (absent: trace's defaults)
        max_per_node: 4
      treepo:
        branch: 2

A run reads the shared fields and its own strategy's section (``AllocationConfig.knobs``), never
another's: a grpo run has no trace knob to read, and a knob set at the top level, or in the wrong
section, is refused with its name. The other sections are there so that one file describes every
strategy of a comparison (``compare`` only swaps ``strategy``); ``--set allocation.trace.min_active=2``
reaches a section. Each default is the best measured setting (docs/experiments.md), stated once,
on its field: a section left out is that strategy at its best.

Names are data here: ``strategy`` is checked once, at start, against the registry in
``strategies`` (``trace_core.runtime.check_names``); ``SECTIONS`` lists the strategies that have
settings, and a test keeps it equal to the registry.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Objective = Literal["groups", "trajectories"]
OBJECTIVES: tuple[str, ...] = ("groups", "trajectories")
Stratify = Literal["none", "task", "cell"]


class Knobs(BaseModel):
    """Base of the per-strategy sections (no field of its own)."""

    model_config = ConfigDict(extra="forbid")


# ----------------------------------------------------------------------------- the stage rules, each field once
class _ExactRoots(Knobs):
    max_per_prompt: int = Field(8, ge=1, le=4096, description="Largest m of TRACE root allocation (M).")
    min_active: int = Field(  # measured: m = 4 each beat full groups of 8 (experiments log, breadth)
        4, ge=1, le=4096, description="Smallest non-zero m: one rollout alone has no contrast.")
    root_objective: Objective = Field(
        "groups",
        description="What TRACE root allocation maximises: 'groups' = expected contrastive groups "
        "(sum V_root(v, m)); 'trajectories' = expected trajectories in them (sum m V_root(v, m)), the "
        "rollouts with a non-zero advantage.",
    )
    root_posterior: bool = Field(
        False,
        description="Value each candidate prompt by its objective's expectation under the prompt's Beta posterior "
        "(the predictor's mean and the pseudo-trajectories behind it: prior strength + the prompt's discounted "
        "record) instead of at the mean: a prompt known only from its cell is worth less than one whose own "
        "record puts it near 0.5. Off: the plug-in value. Predictors without a posterior get the plug-in.",
    )
    root_thompson: bool = Field(
        False,
        description="Thompson sampling of the roots: plan each iteration on one draw per candidate from its Beta "
        "posterior (seeded by run seed and iteration) instead of on the mean, so prompts the run knows little "
        "about are sometimes tried and a long record near 0.5 is not picked every step. The prediction recorded "
        "and scored stays the mean. Predictors without a posterior plan on the mean. Exclusive with root_posterior.",
    )

    @model_validator(mode="after")
    def _ranges(self):
        if self.max_per_prompt < self.min_active:
            raise ValueError(f"max_per_prompt ({self.max_per_prompt}) must be >= min_active ({self.min_active})")
        if self.root_posterior and self.root_thompson:
            raise ValueError("root_posterior and root_thompson are exclusive: value at the posterior mean or at a draw")
        return self


class _Extensions(Knobs):
    root_share: float | None = Field(
        None, gt=0.0, le=1.0,
        description="Fraction of the budget spent on raw rollouts, the rest on prefix continuations. "
        "None: trace spends by one price across roots and continuations (see ext_reserve); treepo, "
        "trace-root and trace-prefix split 0.5 / 0.5.",
    )
    max_per_node: int = Field(4, ge=1, le=4096, description="Largest K continuations from one prefix.")


class _RandomBranching(Knobs):
    branch: int = Field(2, ge=1, le=4096, description="Continuations per randomly chosen prefix.")


class _ExactPrefixes(Knobs):
    prefix_objective: Objective = Field(
        "trajectories",
        description="What TRACE prefix allocation maximises: 'groups' = expected branch groups with a "
        "reward flip (sum V_pref(v, r, k)); 'trajectories' = expected trajectories in them (sum (k+1) "
        "V_pref: k continuations plus the raw trajectory).",
    )
    token_budget: bool = Field(
        False,
        description="Prefix stage costs continuations by remaining turns: the extension budget (in "
        "whole-episode trajectories) buys more short continuations than long ones.",
    )


class _OnePrice(Knobs):
    ext_reserve: float = Field(
        0.1, ge=0.0, lt=1.0,
        description="With root_share None: share of the budget held back from the first root wave at "
        "iteration 0 (later: what the previous iteration bought in continuations, x reserve_slack, "
        "between min_reserve and max_reserve); whatever the prefix stage does not buy goes to a second root wave.",
    )
    reserve_slack: float = Field(
        1.25, ge=1.0, le=10.0,
        description="With root_share None, after iteration 0: the reserve is the continuations the "
        "previous iteration bought times this (1.25 = 25% room for the prefix stage to buy more).",
    )
    max_reserve: float = Field(  # measured: capped at 10% beat a 50% cap (experiments log, breadth)
        0.1, ge=0.0, lt=1.0, description="With root_share None: the largest reserve share.")
    min_reserve: float = Field(
        0.1, ge=0.0, lt=1.0,
        description="With root_share None: the smallest reserve share, so that the prefix stage keeps "
        "being offered continuations to price.",
    )


# ----------------------------------------------------------------------------- one section per strategy
class GrpoKnobs(Knobs):
    """grpo: uniform ``group_size`` rollouts per prompt; nothing else to set."""


class DapoKnobs(Knobs):
    """dapo: grpo plus dynamic sampling."""

    refill: bool = Field(
        True, description="Refill each zero-variance raw group with a fresh prompt's group in a second "
        "wave (dynamic sampling, one round; the extra trajectories and tokens are counted against it).")


class PclKnobs(Knobs):
    """pcl: ``group_size`` rollouts to the prompts whose predicted v is closest to 0.5; nothing else to set."""


class TreepoKnobs(_Extensions, _RandomBranching):
    """treepo: uniform roots, random branching at prefixes."""


class TraceKnobs(_ExactRoots, _Extensions, _ExactPrefixes, _OnePrice):
    """trace: exact root and prefix allocation at one price, a second root wave with what is left."""

    refill: bool = Field(
        False, description="Dynamic sampling, chosen: the trajectories of the zero-variance raw groups are "
        "bought again in the second wave (paid on top of the budget, as dapo's refill), spent by the root "
        "rule on the candidates not yet sampled instead of the stream's next prompts.")
    grow_first: int | None = Field(
        None, ge=1, le=4096,
        description="Adaptive groups: the root stage gives each chosen prompt this many episodes (a grow_share "
        "of the budget) and the prefix stage spends the rest on more episodes of the same prompts, valued by "
        "how their first episodes ended (the expected trajectories in contrastive groups under each prompt's "
        "posterior; groups up to max_per_prompt; trace_core.allocation.growth). No prefix continuations then. "
        "None: off.")
    grow_share: float = Field(
        0.67, gt=0.0, lt=1.0, description="With grow_first: the share of the budget in the first episodes.")

    @model_validator(mode="after")
    def _growth(self):
        if self.grow_first is None:
            return self
        if self.grow_first > self.max_per_prompt:
            raise ValueError(f"grow_first ({self.grow_first}) must be <= max_per_prompt ({self.max_per_prompt})")
        if self.refill:
            raise ValueError("grow_first and refill are exclusive: grow the sampled prompts or refill with new ones")
        if self.root_share is not None:
            raise ValueError("grow_first sets the split itself (grow_share); leave root_share unset")
        return self


class TraceRootKnobs(_ExactRoots, _Extensions, _RandomBranching):
    """trace-root (ablation): exact root allocation, random branching at prefixes."""


class TracePrefixKnobs(_Extensions, _ExactPrefixes):
    """trace-prefix (ablation): uniform roots, exact prefix allocation."""


#: strategy name -> its section's model (the names the registry in ``strategies`` implements)
SECTIONS: dict[str, type[Knobs]] = {
    "grpo": GrpoKnobs, "dapo": DapoKnobs, "pcl": PclKnobs, "treepo": TreepoKnobs, "trace": TraceKnobs,
    "trace-root": TraceRootKnobs, "trace-prefix": TracePrefixKnobs,
}


def section_key(strategy: str) -> str:
    """The section of ``strategy`` in the YAML (``trace-root`` -> ``trace_root``)."""
    return strategy.replace("-", "_")


class AllocationConfig(BaseModel):
    """Strategy and budget of one iteration (units: generated trajectories); the settings only
    some strategies read sit in one section per strategy (``knobs``)."""

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
    group_size: int = Field(
        8, ge=1, le=4096,
        description="Rollouts per prompt of uniform roots (grpo, dapo, pcl, treepo, trace-prefix: n), and "
        "the group of the uniform-GRPO reference every run's closing lines compare against.")
    stratify: Stratify = Field(
        "none",
        description="Breadth for the strategies that choose prompts by predicted value (pcl, trace, "
        "trace-root): 'task' splits the iteration's budget across task families, 'cell' across (family, "
        "difficulty) cells, each in proportion to its share of the candidate pool, and the strategy spends "
        "each share within its stratum (roots, continuations and second wave alike). Without it, a family "
        "whose prompts all sit near v = 0.5 can take nearly the whole budget and the others are forgotten. "
        "The uniform strategies take the stream in order (already a mix) either way.",
    )
    value_shares: float = Field(
        0.0, ge=0.0, le=1.0,
        description="With stratify: how a stratum's share of the budget is set. 0: its share of the candidates; "
        "1: its share of the candidates' summed success variance 4v(1 - v) (where contrast is expected, so a "
        "family that is mostly solved gives its budget to the ones that are not); in between, that mix.",
    )
    min_prob: float = Field(
        0.02, ge=0.0, lt=0.5,
        description="Predicted probabilities are clipped to [min_prob, 1 - min_prob] before allocation: a "
        "predictor is never certain, and exact 0/1 predictions would make every utility zero (no budget spent).",
    )
    grpo: GrpoKnobs | None = Field(None, description="grpo's settings (none).")
    dapo: DapoKnobs | None = Field(None, description="dapo's settings.")
    pcl: PclKnobs | None = Field(None, description="pcl's settings (none).")
    treepo: TreepoKnobs | None = Field(None, description="treepo's settings.")
    trace: TraceKnobs | None = Field(None, description="trace's settings.")
    trace_root: TraceRootKnobs | None = Field(None, description="trace-root's settings.")
    trace_prefix: TracePrefixKnobs | None = Field(None, description="trace-prefix's settings.")

    @model_validator(mode="before")
    @classmethod
    def _knob_in_its_section(cls, data: Any) -> Any:
        """A strategy's knob set at the top level: refused, naming the sections that hold it."""
        if isinstance(data, dict):
            for key, value in data.items():
                owners = [s for s, model in SECTIONS.items() if key in model.model_fields]
                if key not in cls.model_fields and owners:
                    raise ValueError(
                        f"allocation.{key}={value!r}: {key} is a setting of {', '.join(owners)}, not of every "
                        f"strategy; set it in the strategy's section, e.g. allocation.{section_key(owners[0])}.{key}")
        return data

    def knobs(self, strategy: str | None = None) -> Knobs:
        """The settings of ``strategy`` (default: the run's): its section, or its defaults when absent."""
        name = self.strategy if strategy is None else strategy
        if name not in SECTIONS:
            raise KeyError(f"strategy {name!r} has no settings section; known: {', '.join(SECTIONS)}")
        return getattr(self, section_key(name)) or SECTIONS[name]()

    def with_knobs(self, strategy: str, **updates: Any) -> AllocationConfig:
        """A copy with ``updates`` applied to ``strategy``'s section (validated)."""
        knobs = SECTIONS[strategy].model_validate({**self.knobs(strategy).model_dump(), **updates})
        return self.model_copy(update={section_key(strategy): knobs})


def for_strategy(cfg: AllocationConfig, name: str) -> AllocationConfig:
    """``cfg`` as strategy ``name`` runs it: the shared fields and ``name``'s own section, no other
    section (what ``compare`` gives each child of one file, and what a run logs)."""
    kept = {f: v for f, v in cfg.model_dump().items() if f not in _SECTION_FIELDS}
    key = section_key(name)
    if name in SECTIONS and getattr(cfg, key) is not None:
        kept[key] = getattr(cfg, key).model_dump()
    return AllocationConfig.model_validate({**kept, "strategy": name})


def foreign_settings(cfg: AllocationConfig) -> dict[str, object]:
    """The sections ``cfg`` sets for strategies other than its own (read by none of this run's
    stages): section key -> its settings."""
    own = section_key(cfg.strategy)
    return {f: getattr(cfg, f).model_dump() for f in _SECTION_FIELDS if f != own and getattr(cfg, f) is not None}


_SECTION_FIELDS = tuple(section_key(s) for s in SECTIONS)
