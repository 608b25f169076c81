"""`compare --strategies` rows: a strategy at its own group size or under the oracle bound."""

from __future__ import annotations

import pytest

from flows.compare import child_run_id, parse_variant
from trace_core.allocation import strategy_names
from trace_core.config import TrainConfig


def test_a_group_size_and_the_oracle_are_rows_of_their_own():
    base = TrainConfig.model_validate({"allocation": {"strategy": "trace", "group_size": 8}})
    four = parse_variant("grpo@4", strategy_names())
    assert (four.label, four.strategy, four.group_size) == ("grpo@4", "grpo", 4)
    cfg = four.apply(base)
    assert (cfg.allocation.strategy, cfg.allocation.group_size, base.allocation.group_size) == ("grpo", 4, 8)
    oracle = parse_variant("trace@oracle8", strategy_names()).apply(base)
    assert (oracle.allocation.strategy, oracle.predictor.oracle_samples, oracle.predictor.oracle_stages) == (
        "trace", 8, "both")
    roots = parse_variant("trace@rootoracle4", strategy_names())
    assert roots.label == "trace@rootoracle4" and roots.apply(base).predictor.oracle_stages == "roots"
    assert parse_variant("grpo", strategy_names()).apply(base).allocation.group_size == 8
    assert child_run_id("cmp", "grpo@4", 1) == "cmp-grpo-4-s1"


@pytest.mark.parametrize(("text", "says"), [
    ("gpro@4", "unknown strategy 'gpro'"),
    ("trace@4", "does not read a group size"),
    ("grpo@0", "neither a group size"),
    ("grpo@4@8", "neither a group size"),
    ("grpo@oracle", "neither a group size"),
    ("trace@stale0", "neither a group size"),
    ("trace@stale1@stale2", "neither a group size"),
    ("grpo@thompson", "grpo has no root_thompson"),
    ("trace@thompson@posterior", "neither a group size"),
    ("grpo@reference", "grpo has no predicted roots"),
    ("trace@reference@reference", "neither a group size"),
])
def test_a_malformed_row_is_one_line(text, says):
    with pytest.raises(ValueError, match=says) as err:
        parse_variant(text, strategy_names())
    assert "\n" not in str(err.value)


def test_a_stored_run_names_its_row_from_its_config():
    from trace_core.allocation.strategies import run_label

    grpo4 = parse_variant("grpo@4", strategy_names()).apply(TrainConfig()).model_dump()
    oracle = parse_variant("trace@rootoracle4", strategy_names()).apply(TrainConfig()).model_dump()
    assert run_label(grpo4, group_sizes_differ=True) == "grpo@4" and run_label(grpo4) == "grpo"
    assert run_label(oracle, group_sizes_differ=True) == "trace@rootoracle4"


def test_a_pipelined_run_is_a_row_of_its_own():
    from trace_core.allocation.strategies import run_label

    stale = parse_variant("trace@stale1", strategy_names())
    cfg = stale.apply(TrainConfig())
    assert (stale.label, cfg.run.max_staleness, TrainConfig().run.max_staleness) == ("trace@stale1", 1, 0)
    assert run_label(cfg.model_dump()) == "trace@stale1" and run_label(TrainConfig().model_dump()) == "trace"
    assert child_run_id("cmp", "trace@stale1", 2) == "cmp-trace-stale1-s2"


def test_root_value_knobs_are_rows_of_their_own():
    from trace_core.allocation.strategies import run_label

    base = TrainConfig.model_validate({"allocation": {"strategy": "trace"}})
    for mark in ("thompson", "posterior"):
        v = parse_variant(f"trace@{mark}", strategy_names())
        cfg = v.apply(base)
        assert v.label == f"trace@{mark}" and getattr(cfg.allocation.trace, f"root_{mark}") is True
        assert run_label(cfg.model_dump()) == f"trace@{mark}"
    root = parse_variant("trace-root@thompson", strategy_names()).apply(base)
    assert root.allocation.trace_root.root_thompson and run_label(root.model_dump()) == "trace-root@thompson"
    assert run_label(base.model_dump()) == "trace"
    assert child_run_id("cmp", "trace@thompson", 3) == "cmp-trace-thompson-s3"


def test_the_reference_term_is_a_row_of_its_own():
    from trace_core.allocation.strategies import run_label

    base = TrainConfig.model_validate({"allocation": {"strategy": "trace"}})
    v = parse_variant("trace@thompson@reference", strategy_names())
    cfg = v.apply(base)
    assert v.label == "trace@thompson@reference" and cfg.predictor.reference.enabled and not base.predictor.reference.enabled
    assert run_label(cfg.model_dump()) == "trace@thompson@reference"
    assert child_run_id("cmp", "trace@reference", 1) == "cmp-trace-reference-s1"


def test_trace_refill_is_a_row_of_its_own():
    from trace_core.allocation.strategies import run_label

    base = TrainConfig.model_validate({"allocation": {"strategy": "trace"}})
    v = parse_variant("trace@refill", strategy_names())
    cfg = v.apply(base)
    assert v.label == "trace@refill" and cfg.allocation.trace.refill is True and not base.allocation.knobs("trace").refill
    assert run_label(cfg.model_dump()) == "trace@refill" and child_run_id("cmp", v.label, 1) == "cmp-trace-refill-s1"
    dapo = parse_variant("dapo", strategy_names()).apply(base)
    assert run_label(dapo.model_dump()) == "dapo"  # dapo refills by default: no mark
    with pytest.raises(ValueError, match="only trace"):
        parse_variant("dapo@refill", strategy_names())


def test_trace_histshift_is_a_row_of_its_own():
    from trace_core.allocation.strategies import run_label

    base = TrainConfig.model_validate({"allocation": {"strategy": "trace"}})
    v = parse_variant("trace@histshift", strategy_names())
    cfg = v.apply(base)
    assert v.label == "trace@histshift" and cfg.predictor.history_shift.enabled
    assert not base.predictor.history_shift.enabled
    assert run_label(cfg.model_dump()) == "trace@histshift" and child_run_id("cmp", v.label, 2) == "cmp-trace-histshift-s2"
    with pytest.raises(ValueError, match="no predicted roots to shift"):
        parse_variant("grpo@histshift", strategy_names())
    with pytest.raises(ValueError, match="histshift nor growN"):
        parse_variant("trace@histshift@histshift", strategy_names())


def test_trace_grow_is_a_row_of_its_own():
    from trace_core.allocation.strategies import run_label

    base = TrainConfig.model_validate({"allocation": {"strategy": "trace"}})
    v = parse_variant("trace@grow2", strategy_names())
    cfg = v.apply(base)
    assert v.label == "trace@grow2" and cfg.allocation.knobs().grow_first == 2
    assert base.allocation.knobs().grow_first is None
    assert run_label(cfg.model_dump()) == "trace@grow2" and child_run_id("cmp", v.label, 1) == "cmp-trace-grow2-s1"
    with pytest.raises(ValueError, match="only trace grows"):
        parse_variant("grpo@grow2", strategy_names())
    with pytest.raises(ValueError, match="growN"):
        parse_variant("trace@grow2@grow4", strategy_names())
    with pytest.raises(ValueError, match="exclusive"):
        parse_variant("trace@refill@grow2", strategy_names()).apply(base)
