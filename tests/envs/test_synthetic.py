"""Synthetic generators: determinism, difficulty spread, and sound demonstrations."""

import pytest

from trace_core.envs import EnvConfig, make_env, replay
from trace_core.envs.base import Task
from trace_core.envs.families import (
    DEMONSTRATIONS,
    ENVS,
    GENERATORS,
    register_demonstration,
    register_env,
    register_generator,
)
from trace_core.envs.synthetic import demonstration, generate_tasks, sample_tasks

FAMILIES = ["math", "qa", "fc"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("difficulty", [0, 1, 2, 3])
@pytest.mark.parametrize("style", ["compact", "full"])
def test_demonstration_replays_to_reward_one(family, difficulty, style):
    env = make_env(family, prompt_style=style)
    for task in generate_tasks(family, 40, difficulty, seed=3):
        demo = demonstration(task)
        assert all(a.endswith(("</tool_call>", "</answer>")) for a in demo)
        _, results = replay(env, task, demo)
        assert [r.done for r in results] == [False] * (len(demo) - 1) + [True]
        assert results[-1].reward == 1.0 and results[-1].reason == "correct", (task, demo, results)
        assert all(r.reason == "ok" and r.observation for r in results[:-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_deterministic_and_prefix_stable(family):
    a = generate_tasks(family, 6, 2, seed=11)
    b = generate_tasks(family, 3, 2, seed=11)
    c = generate_tasks(family, 6, 2, seed=12)
    assert [t.question for t in a[:3]] == [t.question for t in b]
    assert [t.payload for t in a[:3]] == [t.payload for t in b]
    assert [t.question for t in a] != [t.question for t in c]
    assert a[4].prompt_id == f"{family}-d2-s11-4"
    assert len({t.prompt_id for t in a}) == 6


@pytest.mark.parametrize("family", FAMILIES)
def test_difficulty_spreads_demo_length(family):
    mean_turns = [sum(len(demonstration(t)) for t in generate_tasks(family, 30, d, 0)) / 30 for d in range(4)]
    assert mean_turns == sorted(mean_turns) and mean_turns[3] > mean_turns[0]


def test_text_stays_short():
    for family in FAMILIES:
        for d in range(4):
            for t in generate_tasks(family, 20, d, 1):
                assert len(t.question) <= 90
                assert all(len(a) <= 130 for a in demonstration(t))
    env = make_env("math")
    assert env.reset(generate_tasks("math", 1, 0, 0)[0]).messages()[0]["content"] == "tools: calculator(expression)"


def test_sample_tasks_mixes_families_and_levels():
    cfg = EnvConfig(families={"math": 2.0, "qa": 1.0, "fc": 0.0}, difficulties=[0, 3])
    pool = sample_tasks(cfg, 60, seed=5)
    assert {t.family for t in pool} == {"math", "qa"}
    assert {t.difficulty for t in pool} == {0, 3}
    assert len({t.prompt_id for t in pool}) == 60
    assert [t.prompt_id for t in sample_tasks(cfg, 60, seed=5)] == [t.prompt_id for t in pool]


def test_every_family_registers_env_generator_and_demonstration():
    for registry in (ENVS, GENERATORS, DEMONSTRATIONS):
        assert registry.names() == sorted(FAMILIES)
    assert len({g.salt for g in GENERATORS.values()}) == len(FAMILIES)


def test_registry_rejects_duplicates_and_names_known():
    with pytest.raises(ValueError):
        register_generator("math", 9)(GENERATORS["math"].make)
    with pytest.raises(ValueError, match="salt"):  # a shared salt would alias two families' streams
        register_generator("chess", GENERATORS["qa"].salt)(GENERATORS["math"].make)
    assert "chess" not in GENERATORS
    with pytest.raises(ValueError):
        register_env("qa")(ENVS["qa"])
    with pytest.raises(ValueError):
        register_demonstration("fc")(DEMONSTRATIONS["fc"])
    with pytest.raises(KeyError, match="known"):
        generate_tasks("chess", 1, 0, 0)
    with pytest.raises(KeyError, match="known"):
        make_env("chess")
    with pytest.raises(KeyError, match="known: fc, math, qa"):
        demonstration(Task("x-0", "chess", 0, "?"))
    with pytest.raises(ValueError, match="chess"):
        EnvConfig(families={"chess": 1.0})
