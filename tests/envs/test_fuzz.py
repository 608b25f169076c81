"""Untrusted model output: every parser, tool and verifier returns a reason, never raises or hangs."""

import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.envs.test_loaders import SAMPLES
from trace_core.envs import make_env
from trace_core.envs.actions import loads_bounded, parse_action
from trace_core.envs.fc.check import ast_match, schema_error
from trace_core.envs.loaders import load_tasks
from trace_core.envs.math.answers import check_math
from trace_core.envs.math.calculator import calculate
from trace_core.envs.qa.answers import check_qa
from trace_core.envs.synthetic import generate_tasks

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TASKS = [generate_tasks(f, 1, 3, seed=0)[0] for f in ("math", "qa", "fc")] + load_tasks("bfcl", SAMPLES / "bfcl")[:1]
ENVS = {f: make_env(f) for f in ("math", "qa", "fc")}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=20)
markers = st.sampled_from(["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<think>", "</think>", "{", "}",
                           '"name"', '"arguments"', ":", ",", '"calculator"', '"search"', '"get_stock"', "9**9**9"])
turns = st.one_of(
    st.text(max_size=200),
    st.lists(markers | st.text(max_size=10), max_size=20).map("".join),
    st.builds(lambda n, a: "<tool_call>" + json.dumps({"name": n, "arguments": a}) + "</tool_call>",
              st.sampled_from(["calculator", "search", "get_stock", "book_room", "x", "geometry.rectangle_area"]),
              st.dictionaries(st.sampled_from(["expression", "query", "item", "room", "day", "length", "z"]),
                              json_values, max_size=3)),
)


@FAST
@given(st.lists(turns, min_size=1, max_size=6))
def test_episodes_never_raise(actions):
    for t in TASKS:
        ep = ENVS[t.family].reset(t)
        for a in actions:
            r = ep.step(a)
            assert isinstance(r.reason, str) and 0.0 <= r.reward <= 1.0
            assert r.done or isinstance(r.observation, str)


@FAST
@given(st.text(max_size=80) | st.from_regex(r"[0-9+\-*/(). ^%]{1,60}", fullmatch=True))
def test_calculator_total(expr):
    obs, reason = calculate(expr)
    assert isinstance(obs, str) and reason in {"ok", "tool_error", "bad_arguments"}


@FAST
@given(st.text(max_size=100), st.text(max_size=30))
def test_verifiers_total(pred, gold):
    assert check_math(pred, gold)[1] and check_qa(pred, [gold])[1]


@FAST
@given(json_values, json_values)
def test_ast_and_schema_total(args, gt):
    calls = [("f", args)] if isinstance(args, dict) else []
    ast_match(calls, [gt] if isinstance(gt, dict) else [])
    schema_error({"type": "object", "properties": {"a": {"type": "integer"}}}, args)


def test_adversarial_inputs_bounded_time():
    nested = "[" * 100_000 + "]" * 100_000
    cases = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "9**9**9**9"}}</tool_call>',
        "<tool_call>" + nested + "</tool_call>",
        '<tool_call>{"name": "x", "arguments": ' + '{"a":' * 5000 + "1" + "}" * 5000 + "}</tool_call>",
        "<answer>" + "9" * 1_000_000 + "</answer>",
        "x" * 1_000_000,
        "<tool_call>" * 200_000,
        "<answer>\u202e\u0000\ud800\U0001f600 Z\u0301alg\u0337o ＿１２３</answer>",
        '<tool_call>{"name": "search", "arguments": {"query": "' + "a " * 100_000 + '"}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "' + "(" * 99 + "1" + ")" * 99 + '"}}</tool_call>',
    ]
    for t in TASKS:
        env = ENVS[t.family]
        for c in cases:
            start = time.perf_counter()
            r = env.reset(t).step(c)
            assert time.perf_counter() - start < 0.5, (t.family, c[:40])
            assert isinstance(r.reason, str)
    assert loads_bounded(nested, max_chars=10**7)[1] == "malformed_json"
    assert parse_action(None).reason == "no_action"
    for pred in ["9" * 1_000_000, "\\boxed{" * 100_000, "1/" * 100_000, "\ud800"]:
        start = time.perf_counter()
        check_math(pred, "5")
        check_qa(pred, ["5"])
        assert time.perf_counter() - start < 0.5
