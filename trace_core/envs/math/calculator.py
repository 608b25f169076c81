"""Safe arithmetic evaluator for the calculator tool: an AST whitelist over exact rationals.

``calculate(expr) -> (text, reason)``: ``("19", "ok")`` or ``("error: <what>", reason)``.
Only numeric literals, ``+ - * / // % **``, unary ``+ -`` and parentheses are accepted; names,
calls, attributes, subscripts, strings, comparisons are rejected. ``^`` is read as power and
``×`` / ``÷`` as ``*`` / ``/`` because models write them. Values are ``Fraction`` (exact: 1/3*3
== 1) or ``float`` (non-integer powers only). Bounds keep every call small in time and memory:
expression length, AST node count, magnitude of every intermediate (bit length), and the
exponent checked *before* the power is computed, so ``9**9**9**9`` fails fast.
"""

from __future__ import annotations

import ast
import math
import warnings
from fractions import Fraction

from trace_core.envs.actions import BAD_ARGUMENTS, OK, TOOL_ERROR

MAX_EXPR_CHARS = 200
MAX_NODES = 64
MAX_BITS = 256  # numerator / denominator bit length of any intermediate
MAX_EXPONENT = 256


class CalcError(Exception):
    """A user-facing evaluation error (message is shown to the model)."""


_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _check(v: Fraction | float) -> Fraction | float:
    if isinstance(v, float):
        if not math.isfinite(v) or abs(v) > 2.0**MAX_BITS:
            raise CalcError("too large")
        return v
    if v.numerator.bit_length() > MAX_BITS or v.denominator.bit_length() > MAX_BITS:
        raise CalcError("too large")
    return v


def _pow(a: Fraction | float, b: Fraction | float) -> Fraction | float:
    if isinstance(b, Fraction) and b.denominator == 1:
        e = b.numerator
        if abs(e) > MAX_EXPONENT:
            raise CalcError("exponent too large")
        if a == 0 and e < 0:
            raise CalcError("division by zero")
        if isinstance(a, Fraction):
            bits = max(a.numerator.bit_length(), a.denominator.bit_length())
            if bits * abs(e) > MAX_BITS:  # estimate before computing: the result's size
                raise CalcError("too large")
        return _check(a**e)
    fa, fb = float(a), float(b)
    if fa < 0:
        raise CalcError("complex result")
    if fa > 0 and abs(fb * math.log2(fa)) > MAX_BITS:
        raise CalcError("too large")
    try:
        return _check(fa**fb)
    except (OverflowError, ZeroDivisionError) as exc:
        raise CalcError("too large" if isinstance(exc, OverflowError) else "division by zero") from None


def _binop(op: ast.operator, a: Fraction | float, b: Fraction | float) -> Fraction | float:
    if isinstance(op, ast.Pow):
        return _pow(a, b)
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
        raise CalcError("division by zero")
    if isinstance(op, ast.Add):
        r = a + b
    elif isinstance(op, ast.Sub):
        r = a - b
    elif isinstance(op, ast.Mult):
        r = a * b
    elif isinstance(op, ast.Div):
        r = a / b
    elif isinstance(op, ast.FloorDiv):
        r = Fraction(math.floor(a / b))
    else:
        r = a % b
    return _check(r)


def _eval(node: ast.AST) -> Fraction | float:
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CalcError("only numbers are allowed")
        if isinstance(v, float):
            if not math.isfinite(v):
                raise CalcError("too large")
            return _check(Fraction(repr(v)))  # exact decimal value of the literal
        return _check(Fraction(v))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
        return _binop(node.op, _eval(node.left), _eval(node.right))
    raise CalcError(f"unsupported syntax: {type(node).__name__}")


def format_number(v: Fraction | float) -> str:
    """Integers exactly; terminating fractions as exact decimals; others to 10 significant digits."""
    if isinstance(v, Fraction):
        if v.denominator == 1:
            return str(v.numerator)
        d = v.denominator
        for p in (2, 5):
            while d % p == 0:
                d //= p
        if d == 1 and v.denominator.bit_length() < 64:
            s = f"{float(v):.20f}".rstrip("0").rstrip(".")
            if Fraction(s) == v:
                return s
        v = float(v)
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.10g}"


def evaluate(expr: str) -> Fraction | float:
    """Evaluate or raise ``CalcError``; the public wrapper is ``calculate``."""
    if not isinstance(expr, str):
        raise CalcError("expression must be a string")
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError("expression too long")
    src = expr.replace("^", "**").replace("×", "*").replace("÷", "/").replace("−", "-").strip()
    if not src:
        raise CalcError("empty expression")
    try:
        with warnings.catch_warnings():  # "3x" warns "invalid decimal literal" before failing
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(src, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("syntax error") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError("expression too complex")
    return _eval(tree.body)


def calculate(expr: object) -> tuple[str, str]:
    """``(observation, reason)`` for any input; never raises."""
    if not isinstance(expr, str):
        return "error: expression must be a string", BAD_ARGUMENTS
    try:
        return format_number(evaluate(expr)), OK
    except CalcError as exc:
        return f"error: {exc}", TOOL_ERROR
    except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError):
        return "error: cannot evaluate", TOOL_ERROR
