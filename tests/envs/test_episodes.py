"""Scripted episodes per family: correct, wrong and malformed actions give the right reward/reason."""

import pytest

from trace_core.envs import make_env, replay
from trace_core.envs.base import Task
from trace_core.envs.synthetic import demonstration, generate_tasks

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


def run(family, task, actions, **cfg):
    return replay(make_env(family, **cfg), task, actions)[1]


def math_task(answer="57"):
    return Task("m", "math", 0, "What is (12 + 7) * 3?", {"answer": answer})


def test_math_correct_wrong_and_tool_errors():
    t = math_task()
    res = run("math", t, [CALC % "12 + 7", CALC % "19 * 3", "I think <answer>57</answer>"])
    assert [r.observation for r in res[:2]] == ["19", "57"] and res[-1].reward == 1.0
    assert run("math", t, ["<answer>56</answer>"])[-1].reason == "wrong_answer"
    assert run("math", t, ["<answer></answer>"])[-1].reason == "empty_answer"
    assert run("math", t, ["<answer>fifty</answer>"])[-1].reason == "unparsable_answer"
    r = run("math", t, [CALC % "1/0"])[0]
    assert not r.done and r.observation == "error: division by zero" and r.reason == "tool_error"
    r = run("math", t, [CALC % "9**9**9**9"])[0]
    assert r.observation.startswith("error:") and r.info["tool_error"]


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("just text", "no_action"),
        ("<tool_call>{not json}</tool_call>", "malformed_json"),
        ('<tool_call>{"name": "calculator"', "no_action"),
        ('<tool_call>["calculator"]</tool_call>', "malformed_call"),
        ('<tool_call>{"name": "calculator", "arguments": {}, "x": 1}</tool_call>', "malformed_call"),
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown_tool"),
        ("<answer>57", "no_action"),
    ],
)
def test_malformed_ends_with_reason(action, reason):
    res = run("math", math_task(), [action])
    assert res[-1].done and res[-1].reward == 0.0 and res[-1].reason == reason


def test_malformed_observe_mode_continues():
    res = run("math", math_task(), ["<tool_call>{bad}</tool_call>", "<answer>57</answer>"], on_malformed="observe")
    assert not res[0].done and res[0].observation == "error: malformed_json"
    assert res[1].reward == 1.0


def test_bad_arguments_are_observed():
    res = run("math", math_task(), ['<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'])
    assert not res[0].done and res[0].reason == "bad_arguments" and "missing argument" in res[0].observation


def test_turn_and_token_limits_and_after_end():
    t = math_task()
    res = run("math", t, [CALC % "1 + 1"] * 3, max_turns=3)
    assert [r.done for r in res] == [False, False, True] and res[-1].reason == "turn_limit"
    res = run("math", t, [CALC % "1 + 1"] * 50, max_tokens_per_episode=64)
    assert res[-1].reason == "episode_over" and any(r.reason == "token_limit" for r in res)
    ep = make_env("math").reset(t)
    assert ep.step("x" * 20000).reason == "action_too_long"
    assert ep.step("<answer>57</answer>").reason == "episode_over"
    ep = make_env("math", max_tokens_per_episode=100).reset(t)
    assert ep.step(CALC % "1 + 1", n_tokens=200).reason == "token_limit"


def test_think_block_is_skipped_and_full_prompt_has_schema():
    res = run("math", math_task(), ["<think>maybe <answer>1</answer></think> <answer>57</answer>"])
    assert res[-1].reward == 1.0
    msgs = make_env("math", prompt_style="full").reset(math_task()).messages()
    assert '"name": "calculator"' in msgs[0]["content"] and msgs[1]["content"].startswith("What is")


def test_qa_search_em_and_f1():
    t = generate_tasks("qa", 1, 2, seed=0)[0]
    demo = demonstration(t)
    res = run("qa", t, demo)
    assert res[-1].reward == 1.0 and res[-1].info["f1"] == 1.0
    gold_hop1 = next(x for _, x in t.payload["paragraphs"] if x.startswith(t.payload["hops"][0]))
    assert gold_hop1 in res[0].observation and len(res[0].observation.split("\n")) <= 2
    wrong = run("qa", t, demo[:-1] + ["<answer>Nowhere</answer>"])[-1]
    assert wrong.reason == "wrong_answer" and wrong.reward == 0.0
    half = Task("q", "qa", 0, "?", {"answers": ["Mira Dov"], "paragraphs": [["a", "b"]]})
    r = run("qa", half, ["<answer>Mira</answer>"])[-1]
    assert r.reward == 0.0 and 0 < r.info["f1"] < 1
    assert run("qa", half, ["<answer>Mira</answer>"], partial_credit=True)[-1].reward == pytest.approx(2 / 3)
    assert run("qa", half, ['<tool_call>{"name": "search", "arguments": {"query": "zzz"}}</tool_call>'])[0] \
        .observation == "no results"


def test_qa_top_k_and_shared_corpus():
    t = Task("q", "qa", 0, "?", {"answers": ["x"], "paragraphs": [["a", "red fox"], ["b", "red hen"], ["c", "blue"]]})
    act = '<tool_call>{"name": "search", "arguments": {"query": "red fox"}}</tool_call>'
    assert run("qa", t, [act], search_top_k=1)[0].observation == "red fox"
    env = make_env("qa", corpus=[["Fox", "The fox is red."], ["Hen", "A hen."]])
    ep = env.reset(t)
    assert ep.step(act).observation.startswith("Fox: The fox is red.")


def test_fc_sandbox_state_and_answer():
    t = generate_tasks("fc", 1, 2, seed=4)[0]
    demo = demonstration(t)
    assert run("fc", t, demo)[-1].reward == 1.0
    # right answer text but the state was never changed -> wrong_state
    assert run("fc", t, [demo[-1]])[-1].reason == "wrong_state"
    assert run("fc", t, demo[:-1] + ["<answer>b99</answer>"])[-1].reason == "wrong_answer"
    assert run("fc", t, demo[:-1] + ["<answer>b99</answer>"], partial_credit=True)[-1].reward == 0.5
    r = run("fc", t, ['<tool_call>{"name": "book_room", "arguments": {"room": "A", "day": "x"}}</tool_call>'])[0]
    assert r.reason == "bad_arguments" and not r.done


def test_fc_sandbox_replay_is_exact():
    t = generate_tasks("fc", 1, 3, seed=2)[0]
    demo = demonstration(t)
    env = make_env("fc")
    a = [r.observation for r in replay(env, t, demo)[1]]
    b = [r.observation for r in replay(env, t, demo)[1]]
    assert a == b and t.payload["state"] != t.payload["expected_state"]  # the task's own state untouched


def test_tool_time_limit_is_enforced():
    import time as _time

    from trace_core.envs.episode import call_with_timeout

    start = _time.perf_counter()
    assert call_with_timeout(lambda: (_time.sleep(1.0), ("late", "ok"))[1], 0.1) == ("error: timeout", "tool_timeout")
    assert _time.perf_counter() - start < 0.5
    assert call_with_timeout(lambda: ("fine", "ok"), 0.5) == ("fine", "ok")  # a fresh pool serves later calls
    assert call_with_timeout(lambda: 1 / 0, 0.5) == ("error: internal", "internal_error")
