"""Calculator, math / QA answer checks and the BFCL AST rule."""

import time
from fractions import Fraction

import pytest

from trace_core.envs.fc.check import ast_match, schema_error, to_json_schema
from trace_core.envs.math.answers import check_math, extract_boxed, parse_number
from trace_core.envs.math.calculator import calculate
from trace_core.envs.qa.answers import check_qa, token_f1


@pytest.mark.parametrize(
    ("expr", "out"),
    [("12 + 7", "19"), ("(12 + 7) * 3", "57"), ("1/3*3", "1"), ("7 / 2", "3.5"), ("2^10", "1024"),
     ("-3 + +4", "1"), ("7 // 2", "3"), ("7 % 3", "1"), ("2 ** 0.5", "1.414213562"), ("1/3", "0.3333333333"),
     ("3 × 4 ÷ 2", "6"), ("0.1 + 0.2", "0.3"), ("1e3", "1000"), ("2**-2", "0.25")],
)
def test_calculator_values(expr, out):
    assert calculate(expr) == (out, "ok")


@pytest.mark.parametrize(
    "expr",
    ["9**9**9**9", "10**1000", "2**100000", "(-8) ** 0.5", "1/0", "5 % 0", "__import__('os')", "x + 1",
     "abs(-1)", "'a' * 3", "[1] * 3", "1 if 1 else 2", "1 < 2", "True + 1", "(1," , "1" * 500,
     "(" * 150 + "1" + ")" * 150, "lambda: 1", "9" * 150 + "**9", "1e308 * 10", "float('inf')"],
)
def test_calculator_rejects_fast(expr):
    t = time.perf_counter()
    obs, reason = calculate(expr)
    assert obs.startswith("error:") and reason in {"tool_error", "bad_arguments"}
    assert time.perf_counter() - t < 0.05


def test_calculator_non_string():
    assert calculate(12) == ("error: expression must be a string", "bad_arguments")


@pytest.mark.parametrize(
    ("pred", "gold", "ok"),
    [("57", "57", True), ("57.0", "57", True), ("\\boxed{57}", "57", True), ("1,500", "1500", True),
     ("$1,500.00", "1500", True), ("18 dollars", "18", True), ("45 km/h", "45", True), ("50%", "50", True),
     ("1/2", "0.5", True), ("\\frac{7}{8}", "0.875", True), ("\\dfrac{7}{8}", "\\frac{7}{8}", True),
     ("-3", "-3", True), ("The answer is \\boxed{\\frac{1}{3}}", "1/3", True), ("120^\\circ", "120", True),
     ("\\sqrt{3}", "\\sqrt{3}", True), ("\\sqrt 3", "\\sqrt{3}", True), ("56", "57", False),
     ("0.333", "1/3", False), ("5 and 6", "5", False)],
)
def test_check_math(pred, gold, ok):
    reward, reason, _ = check_math(pred, gold)
    assert (reward == 1.0) == ok and reason == ("correct" if ok else reason)


def test_number_parsing_and_boxed():
    assert parse_number("1,234,567") == 1234567
    assert parse_number("1,23") is None  # not a thousands separator
    assert parse_number("-\\frac{3}{4}") == Fraction(-3, 4)
    assert extract_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert extract_boxed("\\boxed{unclosed") is None


def test_qa_normalisation():
    assert check_qa("The Cello.", ["cello"])[0] == 1.0
    assert check_qa("Lodra City", ["Lodra", "Lodra City"])[0] == 1.0
    assert token_f1("Mira", "Mira Dov") == pytest.approx(2 / 3)
    assert check_qa("  ", ["x"])[1] == "empty_answer"


GT = [{"f": {"a": [1], "b": ["New York", "NYC"], "c": ["", 2.0]}}]


@pytest.mark.parametrize(
    ("calls", "exact"),
    [([("f", {"a": 1, "b": "new york"})], True), ([("f", {"a": 1, "b": "NYC", "c": 2})], True),
     ([("f", {"a": 1.0, "b": "NYC"})], False),  # float where int expected
     ([("f", {"a": 1})], False), ([("f", {"a": 1, "b": "NYC", "d": 0})], False),
     ([("g", {"a": 1, "b": "NYC"})], False), ([("f", {"a": 1, "b": "NYC"})] * 2, False), ([], False)],
)
def test_ast_rule(calls, exact):
    assert ast_match(calls, GT)[1] is exact


def test_ast_parallel_order_free_and_schema():
    gt = [{"w": {"city": ["Oslo"]}}, {"w": {"city": ["Lisbon"]}}]
    assert ast_match([("w", {"city": "Lisbon"}), ("w", {"city": "Oslo"})], gt) == (2, True)
    schema = to_json_schema({"type": "dict", "properties": {"x": {"type": "float"}, "y": {"type": "any"}},
                             "required": ["x"]})
    assert schema_error(schema, {"x": 1, "y": [1]}) is None
    assert "required" in schema_error(schema, {"y": 1})
    assert schema_error(schema, {"x": "a"}) is not None
    assert schema_error(schema, {"x": 1, "z": 1}) is not None
