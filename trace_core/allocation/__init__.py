"""TRACE budget allocation: exact root and prefix solvers, the cost-aware solver, strategies.

Public API (extended with keyword arguments only):

* ``allocate_roots(v, budget, *, max_per_prompt=8, min_active=2, cost=None, objective="groups",
  min_gain=0.0)``: rollouts per prompt (``roots.py``).
* ``allocate_prefixes(v, r, budget, *, max_per_node=8, cost=None, objective="groups",
  min_gain=0.0)``: continuations per prefix node (``prefixes.py``).
* ``marginal_threshold(values, counts, *, min_active=1, cost=None)``: the price (value per budget
  unit of the cheapest step bought) of an allocation, to pass as another stage's ``min_gain``
  (``knapsack.py``); ``values`` from ``trace_core.utility.root_objective_table`` /
  ``prefix_objective_table``.
* ``chain_greedy_cost``: the unequal-cost knapsack over value tables (``cost.py``).
* Strategies: ``get_strategy``, ``strategy_names``, ``register_strategy``, ``Strategy``
  (``strategies.py``); their settings, ``AllocationConfig`` (shared fields plus one section per
  strategy), in ``config.py`` (pure pydantic).

Modules: ``config`` (settings, objectives), ``inputs`` (argument checks), ``hull`` (concave hulls
as unit slopes), ``knapsack`` (exact threshold + repair solver over value tables), ``roots``,
``prefixes``, ``cost``, ``strategies``. Submodules import each other, never this package.
"""

from trace_core.allocation.config import OBJECTIVES, Objective
from trace_core.allocation.cost import chain_greedy_cost
from trace_core.allocation.knapsack import marginal_threshold
from trace_core.allocation.prefixes import allocate_prefixes
from trace_core.allocation.roots import allocate_roots
from trace_core.allocation.strategies import (
    Strategy,
    get_strategy,
    register_strategy,
    strategy_names,
)

__all__ = [
    "OBJECTIVES",
    "Objective",
    "Strategy",
    "allocate_prefixes",
    "allocate_roots",
    "chain_greedy_cost",
    "get_strategy",
    "marginal_threshold",
    "register_strategy",
    "strategy_names",
]
