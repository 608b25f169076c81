"""Allocation strategies: how one iteration spends its trajectory budget (a registry, one signature).

Every strategy gets the same total budget ``B = budget_total`` generated trajectories. A strategy
without an extension stage spends all of ``B`` on roots. The fixed-split ones (treepo,
trace-root, trace-prefix) spend ``floor(root_share * B)`` on raw rollouts (``root_share`` 0.5
unless set) and the rest on prefix continuations. ``trace`` spends by one price (a Lagrange
multiplier across both stages, the paper's view of both as budget decisions on tree anchors):
the roots get ``B - reserve`` (the reserve: what the previous iteration bought in continuations,
times ``reserve_slack``; ``ext_reserve * B`` at iteration 0), the prefix stage buys a continuation only where
its marginal value per trajectory beats the roots' last purchase (``marginal_threshold``), and
what it leaves is spent where it is worth most — more continuations or a second root wave over
the candidates not yet sampled (one exact knapsack over both). A set
``root_share`` overrides this with a fixed split. The candidate order is the prompt stream: uniform strategies take
the first ``root_budget // group_size`` candidates, so every strategy sees the same stream.

===============  =====================================  =====================================
name             roots                                  prefix extensions
===============  =====================================  =====================================
grpo             first candidates, ``n`` each           none
dapo             as grpo; zero-variance groups dropped  none (a second wave refills the
                 from the update (still paid for)       dropped groups, paid on top)
pcl              ``n`` each to the candidates with      none
                 predicted v closest to 0.5
treepo           uniform (as grpo) on the root budget   random prefixes, ``branch`` each
trace            exact TRACE root allocation            exact TRACE prefix allocation
                 (``trace.refill``: the zero-variance
                 groups' trajectories bought again by
                 the root rule, paid on top)
trace-root       exact TRACE root allocation            random (as treepo): root stage ablation
trace-prefix     uniform (as treepo)                    exact TRACE prefix allocation
===============  =====================================  =====================================

``allocation.stratify`` (``task`` or ``cell``) applies to the strategies that choose prompts by
predicted value (``Strategy.stratifies``: pcl, trace, trace-root): the planner runs them once per
stratum on its share of the budget (``planner.split_budget``); the others take the stream.

``treepo`` / ``trace-root`` / ``trace-prefix`` / ``trace`` is the paper's 2x2 ablation
(uniform/uniform, root only, prefix only, both) at one budget split. The exact TRACE stages
maximise their section's ``root_objective`` / ``prefix_objective`` (expected contrastive groups
or the trajectories in them). Each strategy reads the shared allocation fields and its own
section, ``cfg.knobs(self.name)`` (``config.py``), never another strategy's.

Signatures (``Strategy``)::

    root_budget(cfg, reserve=None) -> int               # raw rollouts of the first wave
    allocate_roots(v_pred (C,), cfg, rng, budget=None, concentration=None) -> (C,) int   # m per candidate
    root_threshold(v_pred (C,), m (C,), cfg, concentration=None) -> float   # the roots' price (0: none)
    allocate_prefixes(v_prefix (P,), r (P,), depth (P,), remaining_turns (P,), budget, cfg, rng,
                      min_gain=0.0) -> (P,) int          # K per open prefix, sum <= budget
    spend_leftover(v_pred (C,), taken (C,) bool, v_prefix, r, k (P,), budget, cfg, concentration=None)
        -> ((C,) int, (P,) int)                          # leftover: second-wave m, extra K

``concentration`` (C,): the pseudo-trajectories behind each ``v_pred`` (the predictor's posterior);
the exact-root strategies value prompts under it when their ``root_posterior`` knob is on.
    refill(v_pred (C,), taken (C,) bool, zero_variance_groups, cfg, zero_variance_trajectories=0,
           concentration=None) -> (C,) int               # dynamic sampling's second wave
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from trace_core.allocation.config import (  # for_strategy, foreign_settings: re-exported for the flows
    AllocationConfig,
    TraceKnobs,
    TracePrefixKnobs,
    for_strategy,  # noqa: F401
    foreign_settings,  # noqa: F401
    section_key,
)
from trace_core.allocation.knapsack import marginal_threshold, solve_table
from trace_core.allocation.prefixes import allocate_prefixes
from trace_core.allocation.roots import allocate_roots
from trace_core.registry import Registry
from trace_core.utility import prefix_objective_table, root_objective_table

_REGISTRY: Registry[type[Strategy]] = Registry("strategy")


def register_strategy(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator: register a strategy under ``name`` (a duplicate name is rejected)."""

    def deco(cls: type[Strategy]) -> type[Strategy]:
        _REGISTRY.add(name, cls)
        cls.name = name
        return cls

    return deco


#: the strategies whose roots are ``group_size`` rollouts each (grpo's uniform roots, or pcl's pick):
#: the ones a comparison can run at several group sizes (``compare --strategies grpo@4``)
GROUP_SIZE_STRATEGIES = ("grpo", "dapo", "pcl", "treepo", "trace-prefix")
#: the strategies with the exact root rule's ``root_posterior`` / ``root_thompson`` knobs
#: (``compare --strategies trace@thompson``)
ROOT_VALUE_STRATEGIES = ("trace", "trace-root")


def run_label(config: dict, group_sizes_differ: bool = False) -> str:
    """The row a run belongs to in a comparison, from its config (``runs.config_json``):
    its strategy, ``@N`` for a uniform strategy's group size when ``group_sizes_differ``, and
    ``@oracleK`` / ``@rootoracleK`` for the oracle bound, ``@staleS`` for a pipelined run and
    ``@posterior`` / ``@thompson`` for the root values' knobs and ``@reference`` for the roots'
    reference term (``compare``'s variant names), ``@restW`` for ``predictor.zero_variance_rest``, ``@cooldownC`` for ``predictor.cooldown``,
    ``@refill`` for ``trace.refill``, ``@histshift`` for ``predictor.history_shift``, ``@growN`` for
    ``trace.grow_first``."""
    alloc, pred = config.get("allocation", {}), config.get("predictor", {})
    label = str(alloc.get("strategy", "?"))
    if group_sizes_differ and label in GROUP_SIZE_STRATEGIES:
        label += f"@{alloc.get('group_size')}"
    if pred.get("oracle_samples"):
        label += f"@{'root' if pred.get('oracle_stages') == 'roots' else ''}oracle{pred['oracle_samples']}"
        if pred.get("oracle_knows", "rates") != "rates":
            label += f"{pred['oracle_knows']}"
    if config.get("run", {}).get("max_staleness"):
        label += f"@stale{config['run']['max_staleness']}"
    knobs = alloc.get(section_key(str(alloc.get("strategy", "")))) or {}
    for mark in ("posterior", "thompson"):
        if knobs.get(f"root_{mark}"):
            label += f"@{mark}"
    if (pred.get("reference") or {}).get("enabled"):
        label += "@reference"
    if pred.get("zero_variance_rest"):
        label += f"@rest{pred['zero_variance_rest']}"
    if pred.get("cooldown"):
        label += f"@cooldown{pred['cooldown']}"
    if alloc.get("strategy") == "trace" and knobs.get("refill"):
        label += "@refill"
    if (pred.get("history_shift") or {}).get("enabled"):
        label += "@histshift"
    if alloc.get("strategy") == "trace" and knobs.get("grow_first"):
        label += f"@grow{knobs['grow_first']}"
    return label


def strategy_names() -> list[str]:
    return _REGISTRY.names()


def get_strategy(name: str) -> Strategy:
    """The registered strategy ``name``; an unknown name raises ``KeyError`` listing the known ones."""
    return _REGISTRY.get_item(name)()


# ----------------------------------------------------------------------------- stage policies
def uniform_roots(n_candidates: int, budget: int, n: int) -> np.ndarray:
    """``n`` rollouts to each of the first ``budget // n`` candidates (the stream order)."""
    m = np.zeros(n_candidates, dtype=np.int64)
    m[: min(n_candidates, budget // n)] = n
    return m


def pcl_roots(v: np.ndarray, budget: int, n: int) -> np.ndarray:
    """``n`` rollouts to the ``budget // n`` candidates whose v is closest to 0.5 (ties: lower index)."""
    m = np.zeros(v.shape[0], dtype=np.int64)
    chosen = np.argsort(np.abs(np.asarray(v, dtype=float) - 0.5), kind="stable")[: budget // n]
    m[chosen] = n
    return m


def random_prefixes(n_nodes: int, budget: int, branch: int, max_per_node: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Uniformly random branching: nodes in a random order get ``branch`` continuations each
    (the last one what is left), round after round, up to ``max_per_node``."""
    k = np.zeros(n_nodes, dtype=np.int64)
    if n_nodes == 0:
        return k
    order = rng.permutation(n_nodes)
    left = int(budget)
    while left > 0 and k.min() < max_per_node:
        add = np.minimum(branch, max_per_node - k[order])
        take = np.minimum(add, np.maximum(left - (np.cumsum(add) - add), 0))
        k[order] += take
        left -= int(take.sum())
    return k


def trace_prefixes(v, r, remaining_turns, budget: int, knobs: TraceKnobs | TracePrefixKnobs,
                   min_gain: float = 0.0) -> np.ndarray:
    """Exact TRACE prefix allocation; with ``token_budget`` a continuation costs its remaining
    turns and the budget is ``budget`` whole episodes (longest depth + remaining). ``min_gain``:
    the price per trajectory a continuation must beat (per episode-length unit with tokens)."""
    if not knobs.token_budget or len(v) == 0:
        return allocate_prefixes(v, r, budget, max_per_node=knobs.max_per_node, objective=knobs.prefix_objective,
                                 min_gain=min_gain)
    remaining = np.asarray(remaining_turns, dtype=float)
    episode = float(remaining.max())  # a fresh rollout costs a whole episode
    return allocate_prefixes(v, r, budget * episode, max_per_node=knobs.max_per_node, cost=remaining,
                             objective=knobs.prefix_objective, min_gain=min_gain / episode)


def _increments(table: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Row i: the value of ``j`` more units on top of ``k[i]`` (``-inf`` past the table's end)."""
    n, width = table.shape
    out = np.full((n, width), -np.inf)
    for j in range(width):
        ok = k + j < width
        out[ok, j] = table[ok, k[ok] + j] - table[ok, k[ok]]
    return out


# ----------------------------------------------------------------------------- strategies
DEFAULT_ROOT_SHARE = 0.5  # the fixed split of the ablations when root_share is not set


class Strategy:
    """Base: uniform roots, no extensions. Subclasses override one stage at a time."""

    name: ClassVar[str] = ""
    has_extensions: ClassVar[bool] = False
    shares_price: ClassVar[bool] = False  # trace: one threshold across roots and continuations
    drop_zero_variance: ClassVar[bool] = False  # dapo: zero-variance groups leave the update
    stratifies: ClassVar[bool] = False  # chooses prompts by predicted value: allocation.stratify applies

    def one_price(self, cfg: AllocationConfig) -> bool:
        return self.shares_price and cfg.knobs(self.name).root_share is None

    def root_budget(self, cfg: AllocationConfig, reserve: int | None = None) -> int:
        """First-wave raw rollouts: all of B, a fixed share, or B minus the reserve (one price)."""
        if not self.has_extensions:
            return cfg.budget_total
        k = cfg.knobs(self.name)
        if self.one_price(cfg):
            held = int(np.ceil(k.ext_reserve * cfg.budget_total)) if reserve is None else int(reserve)
            floor = int(np.ceil(k.min_reserve * cfg.budget_total))
            cap = int(np.floor(max(k.max_reserve, k.min_reserve) * cfg.budget_total))
            return cfg.budget_total - min(max(held, floor), cap)
        share = DEFAULT_ROOT_SHARE if k.root_share is None else k.root_share
        return int(np.floor(share * cfg.budget_total))

    def allocate_roots(self, v_pred, cfg: AllocationConfig, rng: np.random.Generator,
                       budget: int | None = None, concentration=None) -> np.ndarray:
        return uniform_roots(len(v_pred), self.root_budget(cfg) if budget is None else budget, cfg.group_size)

    def root_threshold(self, v_pred, m, cfg: AllocationConfig, concentration=None) -> float:
        """The price continuations must beat (value per trajectory of the roots' last purchase)."""
        return 0.0

    def allocate_prefixes(self, v_prefix, r, depth, remaining_turns, budget: int, cfg: AllocationConfig,
                          rng: np.random.Generator, min_gain: float = 0.0) -> np.ndarray:
        return np.zeros(len(v_prefix), dtype=np.int64)

    def spend_leftover(self, v_root, taken, v_prefix, r, k, budget: int, cfg: AllocationConfig,
                       concentration=None):
        """What the prefix stage left (one price only): (second-wave m per candidate, extra K per prefix)."""
        return np.zeros(len(v_root), dtype=np.int64), np.zeros(len(v_prefix), dtype=np.int64)

    def refill(self, v_root, taken, zero_variance_groups: int, cfg: AllocationConfig,
               zero_variance_trajectories: int = 0, concentration=None) -> np.ndarray:
        """Second-wave m per candidate that replaces zero-variance raw groups (dynamic sampling only):
        ``zero_variance_groups`` groups holding ``zero_variance_trajectories`` trajectories."""
        return np.zeros(len(v_root), dtype=np.int64)


class _RandomBranching(Strategy):
    has_extensions = True

    def allocate_prefixes(self, v_prefix, r, depth, remaining_turns, budget, cfg, rng, min_gain=0.0):
        k = cfg.knobs(self.name)
        return random_prefixes(len(v_prefix), budget, k.branch, k.max_per_node, rng)


class _TracePrefix(Strategy):
    has_extensions = True

    def allocate_prefixes(self, v_prefix, r, depth, remaining_turns, budget, cfg, rng, min_gain=0.0):
        return trace_prefixes(v_prefix, r, remaining_turns, budget, cfg.knobs(self.name), min_gain=min_gain)


def _posterior(knobs, concentration):
    """The concentration the root values use: the candidates' (``root_posterior`` on) or None (plug-in)."""
    return concentration if getattr(knobs, "root_posterior", False) else None


def _trace_root(self: Strategy, v_pred, cfg: AllocationConfig, rng, budget: int | None = None,
                concentration=None) -> np.ndarray:
    k = cfg.knobs(self.name)
    return allocate_roots(v_pred, self.root_budget(cfg) if budget is None else budget,
                          max_per_prompt=k.max_per_prompt, min_active=k.min_active, objective=k.root_objective,
                          concentration=_posterior(k, concentration))


@register_strategy("grpo")
class Grpo(Strategy):
    """Uniform ``n`` rollouts per prompt, no extensions."""


@register_strategy("dapo")
class Dapo(Strategy):
    """DAPO's dynamic sampling: uniform generation; each zero-variance group is dropped from the
    update (still paid for) and refilled by a group of the next unsampled candidate in the second
    wave (one refill round, ``dapo.refill``), whose trajectories and tokens count against it too."""

    drop_zero_variance = True

    def refill(self, v_root, taken, zero_variance_groups, cfg, zero_variance_trajectories=0, concentration=None):
        m = np.zeros(len(v_root), dtype=np.int64)
        if not cfg.knobs(self.name).refill or zero_variance_groups <= 0:
            return m
        free = np.flatnonzero(~np.asarray(taken, dtype=bool))[:zero_variance_groups]  # the stream order
        m[free] = cfg.group_size
        return m


@register_strategy("pcl")
class Pcl(Strategy):
    """Root only: the prompts whose predicted v is closest to 0.5, ``n`` rollouts each."""

    stratifies = True

    def allocate_roots(self, v_pred, cfg, rng, budget=None, concentration=None):
        return pcl_roots(np.asarray(v_pred), self.root_budget(cfg) if budget is None else budget, cfg.group_size)


@register_strategy("treepo")
class TreePO(_RandomBranching):
    """Uniform roots plus random branching at prefixes (same extension budget as trace)."""


@register_strategy("trace")
class Trace(_TracePrefix):
    """TRACE: exact root allocation, then exact prefix allocation at the roots' price, then a
    second root wave with what is left (one price; a set ``root_share`` fixes the split instead)."""

    shares_price = True
    stratifies = True
    allocate_roots = _trace_root

    def root_threshold(self, v_pred, m, cfg, concentration=None):
        if not self.one_price(cfg):
            return 0.0
        k = cfg.knobs(self.name)
        table = root_objective_table(v_pred, k.max_per_prompt, k.root_objective, _posterior(k, concentration))
        return marginal_threshold(table, m, min_active=k.min_active)

    def spend_leftover(self, v_root, taken, v_prefix, r, k, budget, cfg, concentration=None):
        """What the priced prefix stage left, spent where it is worth most: more continuations at
        the open prefixes or a second root wave over the candidates not yet sampled (one exact
        knapsack over both value tables). Returns (m2 per candidate, extra K per prefix)."""
        m2, extra = np.zeros(len(v_root), dtype=np.int64), np.zeros(len(v_prefix), dtype=np.int64)
        if not self.one_price(cfg) or budget < 1:
            return m2, extra
        kn = cfg.knobs(self.name)
        free = np.flatnonzero(~np.asarray(taken, dtype=bool))
        conc = _posterior(kn, concentration)
        roots = root_objective_table(np.asarray(v_root)[free], kn.max_per_prompt, kn.root_objective,
                                     None if conc is None else np.broadcast_to(conc, np.shape(v_root))[free])
        roots[:, 1:kn.min_active] = -np.inf
        tables = [roots]
        if not kn.token_budget and len(v_prefix):  # with token costs, only whole episodes compete here
            tables.append(_increments(prefix_objective_table(v_prefix, r, kn.max_per_node, kn.prefix_objective),
                                      np.asarray(k, dtype=np.int64)))
        width = max(t.shape[1] for t in tables)
        F = np.vstack([np.pad(t, ((0, 0), (0, width - t.shape[1])), constant_values=-np.inf) for t in tables])
        x = solve_table(F.T, int(budget)) if F.shape[0] else np.zeros(0, dtype=np.int64)
        m2[free] = x[:free.size]
        if len(tables) > 1:
            extra[:] = x[free.size:]
        return m2, extra

    def refill(self, v_root, taken, zero_variance_groups, cfg, zero_variance_trajectories=0, concentration=None):
        """``trace.refill``: buy the zero-variance groups' trajectories again, paid on top of B, where
        the root rule values them most among the candidates not yet sampled (dapo takes the stream's
        next ones)."""
        m = np.zeros(len(v_root), dtype=np.int64)
        kn = cfg.knobs(self.name)
        if not kn.refill or zero_variance_trajectories < 1:
            return m
        free = np.flatnonzero(~np.asarray(taken, dtype=bool))
        if free.size == 0:
            return m
        conc = _posterior(kn, concentration)
        table = root_objective_table(np.asarray(v_root, dtype=np.float64)[free], kn.max_per_prompt,
                                     kn.root_objective,
                                     None if conc is None else np.broadcast_to(conc, np.shape(v_root))[free])
        table[:, 1:kn.min_active] = -np.inf
        m[free] = solve_table(table.T, int(zero_variance_trajectories))
        return m


@register_strategy("trace-root")
class TraceRoot(_RandomBranching):
    """Ablation: TRACE root allocation, random (treepo) prefix branching."""

    stratifies = True
    allocate_roots = _trace_root


@register_strategy("trace-prefix")
class TracePrefixOnly(_TracePrefix):
    """Ablation: uniform roots, TRACE prefix allocation."""
