"""BFCL loader categories and the AST rule's cases (nested dicts, string standardisation, BFCL's float
rule, greedy matching, relevance), on the project's sample files — no BFCL download needed."""

import json

import pytest

from tests.envs.test_loaders import SAMPLES
from trace_core.envs import make_env, replay
from trace_core.envs.fc.ast_rule import standardize
from trace_core.envs.fc.check import ast_match
from trace_core.envs.loaders import load_tasks
from trace_core.envs.synthetic import demonstration

BFCL = SAMPLES / "bfcl"


def _load(category):
    return load_tasks("bfcl", BFCL, category=category)


def _reward(task, calls):
    """The result that ended the episode (the calls, then an answer if it is still open)."""
    actions = [f'<tool_call>{json.dumps({"name": n, "arguments": a})}</tool_call>' for n, a in calls]
    results = replay(make_env("fc"), task, [*actions, "<answer>done</answer>"])[1]
    return [next(r for r in results if r.done)]


@pytest.mark.parametrize(("category", "ids"), [
    ("multiple", ["multiple_0", "multiple_1"]), ("parallel_multiple", ["parallel_multiple_0"]),
    ("irrelevance", ["irrelevance_0"]), ("live_irrelevance", ["live_irrelevance_0-0-0", "live_irrelevance_1-0-1"]),
    ("live_relevance", ["live_relevance_0-0-0"]), ("parallel", ["parallel_0"])])
def test_category_is_the_exact_file_and_demos_solve_it(category, ids):
    tasks = _load(category)
    assert [t.prompt_id for t in tasks] == [f"bfcl-{i}" for i in ids]
    assert all(t.payload["category"] == category for t in tasks)
    for t in tasks:
        res = replay(make_env("fc"), t, demonstration(t))[1]
        assert res[-1].done and res[-1].reward == 1.0, (t.prompt_id, res[-1])


def test_relevance_rules():
    irrelevant, relevant = _load("irrelevance")[0], _load("live_relevance")[0]
    assert irrelevant.payload["relevance"] == "no_call" and relevant.payload["relevance"] == "some_call"
    call = [("weather.get", {"city": "Lisbon"})]
    assert _reward(irrelevant, call)[-1].reason == "wrong_call" and _reward(irrelevant, call)[-1].reward == 0.0
    assert _reward(relevant, call)[-1].reward == 1.0
    assert _reward(relevant, [])[-1].reason == "no_call"


@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                      "multi_turn_long_context", "memory", "web_search", "simple_java",
                                      "simple_javascript", "format_sensitivity"])
def test_unsupported_categories_say_why(category):
    with pytest.raises(ValueError, match=f"BFCL category {category} is not supported: ") as err:
        _load(category)
    assert "\n" not in str(err.value) and len(str(err.value)) > 60


def test_unknown_category_and_bad_rows(tmp_path):
    with pytest.raises(ValueError, match="unknown BFCL category 'simple'.*simple_python"):
        _load("simple")
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "BFCL_v4_multiple.json").write_text('{"id": "m0", "question": [[]], "function": []}\n{oops\n')
    with pytest.raises(ValueError, match=r"BFCL_v4_multiple.json:2: not a JSON line"):
        load_tasks("bfcl", tmp_path, category="multiple")
    (tmp_path / "BFCL_v4_multiple.json").write_text('{"id": "m0", "question": [[]], "function": []}\n')
    with pytest.raises(FileNotFoundError, match="no possible answers"):
        load_tasks("bfcl", tmp_path, category="multiple")
    (tmp_path / "possible_answer" / "BFCL_v4_multiple.json").write_text('{"id": "m0", "ground_truth": []}\n')
    with pytest.raises(ValueError, match=r"BFCL_v4_multiple.json:1: 'function' must be a list"):
        load_tasks("bfcl", tmp_path, category="multiple")


DATES = {"check_in": "2025-05-01", "check_out": "2025-05-03"}


@pytest.mark.parametrize(("args", "ok"), [
    ({"location": "Porto", "dates": DATES, "room": "double", "guests": 2}, True),
    ({"location": "porto, portugal", "dates": {"check_in": "05/01/2025", "check_out": "2025-05-03"},
      "room": "Double"}, True),                                                    # nested: any allowed per key
    ({"location": "Porto", "dates": {"check_in": "2025 05 01", "check_out": "2025_05_03"}, "room": "DOUBLE"}, True),
    ({"location": "Porto", "dates": {"check_in": "2025-05-02", "check_out": "2025-05-03"}, "room": "double"}, False),
    ({"location": "Porto", "dates": {"check_in": "2025-05-01"}, "room": "double"}, False),  # missing nested key
    ({"location": "Porto", "dates": {**DATES, "late": True}, "room": "double"}, False),    # extra nested key
    ({"location": "Porto", "dates": DATES, "room": "double!"}, False),      # '!' is not standardised away
    ({"location": "Porto", "dates": DATES, "room": "double", "guests": 2.0}, False),  # float for an integer param
    ({"location": "Porto", "dates": DATES}, False),                          # 'room' has no '' (must be given)
])
def test_nested_dict_and_enum_strings(args, ok):
    task = _load("multiple")[0]
    assert ast_match([("hotel.book", args)], task.payload["ground_truth"], task.payload["functions"])[1] is ok
    assert _reward(task, [("hotel.book", args)])[-1].reward == float(ok)


@pytest.mark.parametrize(("value", "ok"), [(21, True), (21.0, True), ("21", False), (21.5, False), (True, False)])
def test_float_rule_for_an_int_answer(value, ok):
    task = _load("multiple")[1]  # temperature: schema float, possible answer [21]
    args = {"temperature": value, "zone": "living room"}
    assert ast_match([("thermostat.set", args)], task.payload["ground_truth"], task.payload["functions"])[1] is ok
    assert _reward(task, [("thermostat.set", args)])[-1].reward == float(ok)


def test_standardize_and_greedy_matching():
    assert standardize("New York, NY") == standardize("new-york_ny.") == "newyorkny"
    assert standardize("O'Brien") == 'o"brien' != standardize("OBrien")
    gt = [{"f": {"x": ["a", "b"]}}, {"f": {"x": ["a"]}}]
    # BFCL takes, for each answer in order, the first free call that matches: the first answer takes
    # call "a", so the second finds none, although the other assignment would match both
    assert ast_match([("f", {"x": "a"}), ("f", {"x": "b"})], gt) == (1, False)
    assert ast_match([("f", {"x": "b"}), ("f", {"x": "a"})], gt) == (2, True)
    assert ast_match([("f", {"x": "a"})] * 3, [{"f": {"x": ["a"]}}] * 2) == (2, False)  # count must match


def test_xlam_dict_and_list_of_dict_answers_are_solvable(tmp_path):
    tools = [{"name": "ship", "description": "Ship parcels.", "parameters": {
        "address": {"type": "dict", "description": "To."}, "items": {"type": "List[dict]", "description": "What."}}}]
    answers = [{"name": "ship", "arguments": {"address": {"city": "Oslo", "zip": "0150"},
                                              "items": [{"sku": "A1", "qty": 2}]}}]
    (tmp_path / "x.json").write_text(json.dumps([{"id": 7, "query": "Ship 2 A1 to Oslo 0150.", "tools": tools,
                                                  "answers": answers}]))
    task = load_tasks("xlam", tmp_path / "x.json")[0]
    res = replay(make_env("fc"), task, demonstration(task))[1]
    assert res[-1].reward == 1.0
    args = answers[0]["arguments"]
    assert _reward(task, [("ship", {**args, "address": {"city": "oslo", "zip": "0150"}})])[-1].reward == 1.0
    assert _reward(task, [("ship", {**args, "address": {"city": "Bergen", "zip": "0150"}})])[-1].reward == 0.0
    assert _reward(task, [("ship", {**args, "items": [{"sku": "A1", "qty": 3}]})])[-1].reward == 0.0
