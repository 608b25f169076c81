"""Synthetic math tasks: a left-to-right chain of operations, one calculator call per operation.

Difficulty knob (operations, operand digits, operators):

=====  ====  ==============  ===========
level  ops   operands        operators
=====  ====  ==============  ===========
0      1     1 digit         + -
1      2     1-2 digits      + - *
2      3     2 digits        + - *
3      4     2-3 digits      + - * /
=====  ====  ==============  ===========

``*`` takes a one-digit factor (2..9) and ``/`` only divides exactly, so every intermediate is a
non-negative integer and the demonstration's observations are short. Example (level 1):
``What is (12 + 7) * 3?`` -> calculator("12 + 7") = 19 -> calculator("19 * 3") = 57 -> 57.
"""

from __future__ import annotations

import numpy as np

from trace_core.envs.base import Task

_OPERANDS = {0: (1, 9), 1: (2, 30), 2: (10, 99), 3: (10, 999)}
_OPERATORS = {0: "+-", 1: "+-*", 2: "+-*", 3: "+-*/"}


def _operand(rng: np.random.Generator, d: int) -> int:
    lo, hi = _OPERANDS[d]
    return int(rng.integers(lo, hi + 1))


def _next_op(rng: np.random.Generator, d: int, r: int) -> tuple[str, int]:
    op = str(rng.choice(list(_OPERATORS[d])))
    if op == "*":
        return op, int(rng.integers(2, 10))
    if op == "/":
        divisors = [k for k in range(2, 10) if r % k == 0 and r > 0]
        if divisors:
            return op, int(rng.choice(divisors))
        op = "+"
    b = _operand(rng, d)
    if op == "-" and b > r:
        return "+", b  # keep intermediates non-negative
    return op, b


def make_math_task(rng: np.random.Generator, difficulty: int, prompt_id: str) -> Task:
    r = _operand(rng, difficulty)
    expr, top_low = str(r), False  # top_low: the expression's top operator is + or -
    steps: list[str] = []
    for _ in range(difficulty + 1):
        op, b = _next_op(rng, difficulty, r)
        steps.append(f"{r} {op} {b}")
        if op in "*/" and top_low:
            expr = f"({expr})"
        expr = f"{expr} {op} {b}"
        top_low = op in "+-"
        r = {"+": r + b, "-": r - b, "*": r * b, "/": r // b}[op]
    return Task(
        prompt_id=prompt_id,
        family="math",
        difficulty=difficulty,
        question=f"What is {expr}?",
        payload={"answer": str(r), "steps": steps, "source": "synthetic"},
    )
