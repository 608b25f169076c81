"""The budget planner: every decision about where one iteration's trajectories go, in one place.

An iteration spends ``B = allocation.budget_total`` generated trajectories. The plan is made in
two steps because the second needs the raw rollouts' outcomes:

1. ``plan_roots(v_root, ...)`` -> ``RootPlan``: the first root wave. Strategies with an extension
   stage hold back a *reserve* for it (one price: what the previous iteration bought in
   continuations × ``reserve_slack``, within [``min_reserve``, ``max_reserve``]·B, ``ext_reserve``·B
   at iteration 0; a fixed split: ``root_share``·B). The roots' *price* is the value per trajectory
   of their last purchase (one price only; 0 otherwise).
2. ``plan_prefixes(roots, v_prefix, r, ...)`` -> ``PrefixPlan``: what the raw rollouts left
   (``B`` − raw trajectories) buys continuations at the open prefixes — with one price only where
   a continuation's marginal value beats the roots' price — and the rest is spent where it is
   worth most: more continuations, or a *second root wave* over the candidates not yet sampled
   (one exact knapsack over both value tables). Dynamic sampling (dapo) also refills each
   all-success / all-failure raw group with a fresh prompt's group in that second wave, and pays
   for it: the over-sampled trajectories and tokens count against the strategy.

Pure (numpy in, frozen dataclasses out, no I/O): ``trace_core.iteration`` calls it with the
predictor's values, ``trace_core.simulate`` with oracle-noised ones, so the simulator runs the
same decisions as the training flow. Strategy-specific rules stay in the strategy registry
(``strategies.py``); this module sequences them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trace_core.allocation.config import AllocationConfig
from trace_core.allocation.strategies import Strategy, get_strategy


@dataclass(frozen=True)
class RootPlan:
    """The first root wave: ``m[i]`` rollouts of candidate ``i`` (0 = skipped)."""

    m: np.ndarray          # (C,) int
    budget: int            # trajectories the first wave may spend (B − reserve)
    reserve: int           # trajectories held back for the prefix stage (0 without one)
    price: float           # value per trajectory of the roots' last purchase (0: no shared price)

    @property
    def used(self) -> int:
        return int(self.m.sum())


@dataclass(frozen=True)
class PrefixPlan:
    """Continuations per open prefix and the second root wave (both bought after the raw rollouts)."""

    k: np.ndarray          # (P,) int continuations per open prefix (priced + leftover)
    second_wave: np.ndarray  # (C,) int rollouts of the second root wave (0 for first-wave prompts)
    budget: int            # trajectories left after the raw rollouts
    priced: int            # continuations bought at the roots' price (before the leftover)

    @property
    def continuations(self) -> int:
        return int(self.k.sum())

    @property
    def wave_rollouts(self) -> int:
        return int(self.second_wave.sum())


def wanted_reserve(cfg: AllocationConfig, previous_continuations: int | None) -> int | None:
    """The one-price reserve asked for: what the previous iteration bought in continuations × the
    slack (None at iteration 0; ``Strategy.root_budget`` then holds ``ext_reserve``·B and bounds
    either to [``min_reserve``, ``max_reserve``]·B)."""
    if previous_continuations is None:
        return None
    return int(np.ceil(cfg.reserve_slack * previous_continuations))


def plan_roots(v_root: np.ndarray, cfg: AllocationConfig, rng: np.random.Generator, *,
               previous_continuations: int | None = None, strategy: Strategy | None = None) -> RootPlan:
    """The first root wave over candidates with predicted success ``v_root`` (C,).

    ``previous_continuations``: continuations the previous iteration bought (None at iteration 0);
    it sets the one-price reserve."""
    strat = strategy or get_strategy(cfg.strategy)
    budget = strat.root_budget(cfg, wanted_reserve(cfg, previous_continuations))
    m = np.asarray(strat.allocate_roots(v_root, cfg, rng, budget=budget), dtype=np.int64)
    return RootPlan(m=m, budget=int(budget), reserve=int(cfg.budget_total - budget),
                    price=float(strat.root_threshold(v_root, m, cfg)))


def plan_prefixes(roots: RootPlan, v_root: np.ndarray, v_prefix: np.ndarray, r: np.ndarray, depth: np.ndarray,
                  remaining_turns: np.ndarray, raw_trajectories: int, cfg: AllocationConfig,
                  rng: np.random.Generator, *, zero_variance_groups: int = 0,
                  strategy: Strategy | None = None) -> PrefixPlan:
    """Continuations per open prefix (``v_prefix``, ``r``, ``depth``, ``remaining_turns``: (P,)) and
    the second root wave, with the ``B − raw_trajectories`` the raw rollouts left.

    ``zero_variance_groups``: raw root groups whose rewards all agree; a dynamic-sampling strategy
    (dapo) refills them with as many fresh groups in the second wave, paid on top of ``B``."""
    strat = strategy or get_strategy(cfg.strategy)
    budget = max(cfg.budget_total - int(raw_trajectories), 0)
    k = np.asarray(strat.allocate_prefixes(v_prefix, r, depth, remaining_turns, budget, cfg, rng,
                                           min_gain=roots.price), dtype=np.int64)
    priced = int(k.sum())
    taken = roots.m > 0
    m2, extra = strat.spend_leftover(np.asarray(v_root), taken, v_prefix, r, k, budget - priced, cfg)
    m2 = np.asarray(m2, dtype=np.int64)
    m2 = m2 + np.asarray(strat.refill(len(v_root), taken | (m2 > 0), zero_variance_groups, cfg), dtype=np.int64)
    return PrefixPlan(k=k + np.asarray(extra, dtype=np.int64), second_wave=m2, budget=budget, priced=priced)
