"""No eval / exec / sympify / parse_expr anywhere in the library (model text must never be executed)."""

import re
from pathlib import Path

import trace_core

# bare builtins only: ``model.eval()`` (torch) and ``re.compile(`` are fine, ``builtins.eval(`` is not
FORBIDDEN = re.compile(
    r"(?<![\w.])(eval|exec|compile)\s*\(|builtins\.(eval|exec)|\bsympify\b|\bparse_expr\b|__import__")


def test_library_never_evaluates_text():
    root = Path(trace_core.__file__).parent
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}"
            for p in root.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert hits == []


def test_pattern_catches_the_forbidden_forms():
    for bad in ["eval(x)", "exec (x)", "builtins.eval(x)", "sympify(s)", "parse_expr(s)", "compile(s, 'f', 'eval')"]:
        assert FORBIDDEN.search(bad), bad
    for ok in ["_eval(node)", "evaluate(expr)", 'ast.parse(src, mode="eval")', "model.eval()", "re.compile(p)"]:
        assert not FORBIDDEN.search(ok), ok
