"""Settings per strategy: the shared allocation fields plus one section per strategy; a run reads
its own section only, a knob outside its section is refused with its name, and a comparison gives
each child the shared fields and its own section."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from trace_core.allocation.config import (
    SECTIONS,
    AllocationConfig,
    TraceKnobs,
    for_strategy,
    foreign_settings,
    section_key,
)
from trace_core.allocation.strategies import get_strategy, strategy_names
from trace_core.config import load_train_config
from trace_core.config.io import ConfigError


def test_every_registered_strategy_has_a_section_and_every_section_a_strategy():
    assert set(SECTIONS) == set(strategy_names())
    assert all(section_key(s) in AllocationConfig.model_fields for s in SECTIONS)


def test_a_grpo_section_holds_no_trace_knob_and_a_knob_outside_its_section_is_named():
    assert set(SECTIONS["grpo"].model_fields) == set()
    assert {"ext_reserve", "min_active", "max_per_node"} <= set(SECTIONS["trace"].model_fields)
    with pytest.raises(ValidationError, match=r"allocation.min_active=2.*trace, trace-root.*allocation.trace.min_active"):
        AllocationConfig(strategy="grpo", min_active=2)
    with pytest.raises(ValidationError, match="extra"):
        AllocationConfig(grpo={"min_active": 2})
    with pytest.raises(ConfigError, match="allocation.trace.min_active"):
        load_train_config(None, ["allocation.trace.min_active=0"])


def test_set_reaches_a_section_and_a_missing_section_is_its_strategys_defaults():
    cfg = load_train_config(None, ["allocation.trace.min_active=2", "allocation.treepo.branch=3"])
    assert cfg.allocation.knobs().min_active == 2 and cfg.allocation.knobs("treepo").branch == 3
    assert cfg.allocation.knobs("trace-root") == SECTIONS["trace-root"]()
    assert AllocationConfig().knobs() == TraceKnobs()


def test_a_comparison_child_keeps_the_shared_fields_and_its_own_section():
    shared = AllocationConfig(strategy="trace", budget_total=96, group_size=4, stratify="task",
                              trace={"min_active": 2, "max_per_node": 8}, treepo={"branch": 3})
    assert foreign_settings(shared) == {"treepo": {"root_share": None, "max_per_node": 4, "branch": 3}}
    grpo = for_strategy(shared, "grpo")
    assert (grpo.strategy, grpo.budget_total, grpo.group_size, grpo.stratify) == ("grpo", 96, 4, "task")
    assert grpo.trace is None and grpo.treepo is None and not foreign_settings(grpo)
    treepo = for_strategy(shared, "treepo")
    assert treepo.knobs().branch == 3 and treepo.trace is None


@pytest.mark.parametrize("name", ["grpo", "dapo", "pcl", "treepo", "trace", "trace-root", "trace-prefix"])
def test_other_sections_change_none_of_a_strategys_decisions(name):
    """A strategy reads its own section only: other strategies' sections leave its roots, price
    and prefixes as they are."""
    rng = np.random.default_rng(0)
    v, vp, r = rng.uniform(0.05, 0.95, 40), rng.uniform(0.05, 0.95, 60), rng.integers(0, 2, 60).astype(float)
    own = AllocationConfig(strategy=name, budget_total=120, group_size=4)
    others = {section_key(s): {"max_per_node": 8} for s in SECTIONS
              if s != name and "max_per_node" in SECTIONS[s].model_fields}
    full = own.model_copy(update={k: SECTIONS[s].model_validate(others[k]) for s in SECTIONS
                                  if (k := section_key(s)) in others})
    strat = get_strategy(name)
    a = strat.allocate_roots(v, full, np.random.default_rng(1))
    b = strat.allocate_roots(v, own, np.random.default_rng(1))
    assert np.array_equal(a, b)
    assert strat.root_budget(full) == strat.root_budget(own)
    assert strat.root_threshold(v, a, full) == strat.root_threshold(v, b, own)
    depth, rem = rng.integers(1, 4, 60), rng.integers(1, 4, 60)
    pa = strat.allocate_prefixes(vp, r, depth, rem, 30, full, np.random.default_rng(2))
    pb = strat.allocate_prefixes(vp, r, depth, rem, 30, own, np.random.default_rng(2))
    assert np.array_equal(pa, pb)
