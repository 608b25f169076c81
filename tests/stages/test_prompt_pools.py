"""Prompt pools: functions of (config, iteration) only, computed once per process."""

from __future__ import annotations

from trace_core.config import TrainConfig
from trace_core.stages.prompt_pools import candidate_pool, heldout_pool, tasks_by_id, training_set


def _cfg(**run) -> TrainConfig:
    return TrainConfig.model_validate({"run": {"train_prompts": 64, "candidate_pool": 16, **run}})


def test_candidates_are_a_function_of_seed_and_iteration():
    a, b = _cfg(), _cfg()
    b.allocation.strategy = "grpo"  # the strategy does not change the prompt stream
    assert [t.prompt_id for t in candidate_pool(a, 3)] == [t.prompt_id for t in candidate_pool(b, 3)]
    assert [t.prompt_id for t in candidate_pool(a, 3)] != [t.prompt_id for t in candidate_pool(a, 4)]
    assert [t.prompt_id for t in candidate_pool(a, 3)] != [t.prompt_id for t in candidate_pool(_cfg(seed=1), 3)]


def test_candidates_come_from_the_training_set_and_recur():
    cfg = _cfg()
    train = {t.prompt_id for t in training_set(cfg)}
    assert len(train) == 64
    seen = [t.prompt_id for i in range(8) for t in candidate_pool(cfg, i)]
    assert set(seen) <= train and len(seen) > len(set(seen))  # prompts recur across iterations
    assert len({t.prompt_id for t in candidate_pool(cfg, 0)}) == 16


def test_fresh_pool_without_training_set():
    cfg = _cfg(train_prompts=0)
    assert len(candidate_pool(cfg, 0)) == 16
    assert not {t.prompt_id for t in candidate_pool(cfg, 0)} & {t.prompt_id for t in candidate_pool(cfg, 1)}


def test_tasks_by_id_is_built_once():
    cfg = _cfg()
    by_id = tasks_by_id(cfg, 2)
    assert tasks_by_id(cfg, 2) is by_id
    assert list(by_id) == [t.prompt_id for t in candidate_pool(cfg, 2)]


def test_heldout_is_disjoint_and_covers_every_cell():
    cfg = _cfg(eval_tasks=24)
    held = heldout_pool(cfg)
    cells = {(t.family, t.difficulty) for t in held}
    assert len(cells) == len([f for f, w in cfg.env.families.items() if w > 0]) * len(cfg.env.difficulties)
    assert not {t.prompt_id for t in held} & {t.prompt_id for t in training_set(cfg)}
