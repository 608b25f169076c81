"""GSM8K / MATH-style (gold, prediction, equivalent?) cases, grouped by the form of the answer.

The third field is the verdict a grader should give (written by hand): the project's checker must
give it on every case; ``math-verify`` is compared on the same cases (``test_math_agreement``,
``benchmarks/learning/verifier_agreement.py``). Predictions are what a model puts in ``<answer>``.
"""

CASES: dict[str, list[tuple[str, str, bool]]] = {
    "integers": [
        ("18", "18", True), ("18", "17", False), ("18", "018", True), ("18", "18.0", True), ("18", "18.00", True),
        ("72", "72", True), ("72", "7 2", False), ("0", "0", True), ("0", "0.0", True), ("100", "1000", False),
        ("5", "5.5", False), ("42", "", False), ("42", "42 42", False),
    ],
    "separators_currency_units": [
        ("1500", "1,500", True), ("1500", "$1,500", True), ("1500", "$1,500.00", True), ("1500", "1500 dollars", True),
        ("18", "$18", True), ("18", "18 dollars", True), ("45", "45 km/h", True), ("12", "12 apples", True),
        ("1234567", "1,234,567", True), ("123", "1,23", False), ("10", "10\\text{ cm}", True), ("10", "10 cm", True),
        ("5", "5 \\text{ meters}", True), ("20", "20 minutes", True), ("7", "7 dollars", True), ("7", "8 dollars", False),
    ],
    "negative": [
        ("-3", "-3", True), ("-3", "3", False), ("-3", "- 3", True), ("-0.5", "-\\frac{1}{2}", True),
        ("-\\frac{1}{2}", "-0.5", True), ("-\\frac{1}{2}", "\\frac{-1}{2}", True), ("-\\frac{1}{2}", "\\frac{1}{2}", False),
        ("-12", "−12", True), ("-7", "-7.0", True),
    ],
    "decimals": [
        ("0.5", "0.5", True), ("0.5", ".5", True), ("0.5", "0.50", True), ("0.5", "1/2", True), ("2.25", "9/4", True),
        ("3.14", "3.14", True), ("3.14", "3.15", False), ("0.875", "\\frac{7}{8}", True), ("1.5", "1.05", False),
    ],
    "fractions_latex": [
        ("\\frac{7}{8}", "7/8", True), ("\\frac{7}{8}", "0.875", True), ("\\frac{7}{8}", "\\frac{14}{16}", True),
        ("\\frac{7}{8}", "\\dfrac{7}{8}", True), ("\\frac{7}{8}", "\\tfrac{7}{8}", True), ("\\frac{7}{8}", "\\frac78", True),
        ("\\frac{7}{8}", "\\frac{8}{7}", False), ("\\frac{1}{3}", "0.333", False), ("\\frac{1}{3}", "0.3333333", True),
        ("\\frac{1}{3}", "1/3", True), ("\\frac{3}{2}", "1\\frac{1}{2}", True), ("\\frac{3}{2}", "1.5", True),
        ("\\frac{1}{2}", "\\frac{2}{4}", True), ("\\frac{2}{3}", "2/3", True), ("\\frac{2}{3}", "3/2", False),
    ],
    "boxed": [
        ("18", "\\boxed{18}", True), ("18", "\\boxed{17}", False), ("\\frac{1}{3}", "\\boxed{\\frac{1}{3}}", True),
        ("18", "so the answer is \\boxed{18}.", True), ("18", "\\boxed{16} then \\boxed{18}", True),
        ("5", "\\fbox{5}", True), ("18", "$\\boxed{18}$", True), ("\\frac{1}{2}", "\\boxed{0.5}", True),
    ],
    "percentages": [
        ("50", "50\\%", True), ("50", "50%", True), ("50", "50 percent", True), ("5\\%", "5", True),
        ("5\\%", "5\\%", True), ("25", "25%", True), ("25", "26%", False),
    ],
    "degrees": [("120", "120^\\circ", True), ("120^\\circ", "120", True), ("90", "90^{\\circ}", True),
                ("90", "91^\\circ", False)],
    "phrases": [
        ("18", "The answer is 18", True), ("18", "the answer is 18.", True), ("18", "x = 18", True),
        ("18", "She has 18 apples left.", True), ("5", "5 and 6", False), ("18", "answer: 18", True),
        ("18", "17 or 18", False), ("6", "between 5 and 7", False), ("18", "The answer is not 18", False),
        ("18", "it isn't 18", False), ("18", "18th", True),
    ],
    "symbolic_forms": [
        ("\\sqrt{3}", "\\sqrt{3}", True), ("\\sqrt{3}", "\\sqrt3", True), ("2\\sqrt{2}", "2\\sqrt{2}", True),
        ("2\\sqrt{2}", "2 \\sqrt{2}", True), ("2\\sqrt{2}", "\\sqrt{8}", True), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
        ("\\pi", "\\pi", True), ("2\\pi", "2 \\pi", True), ("\\infty", "\\infty", True), ("x^2+1", "x^2 + 1", True),
        ("x^2+1", "1+x^2", True), ("\\sqrt{3}", "\\sqrt{2}", False), ("3\\pi", "\\pi", False),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True), ("10^{6}", "1000000", True),
    ],
    "tuples_intervals_sets": [
        ("(1,2)", "(1, 2)", True), ("(1,2)", "(2,1)", False), ("[0,1)", "[0, 1)", True), ("[0,1)", "[0,1]", False),
        ("\\{1,2\\}", "\\{1, 2\\}", True), ("(-\\infty, 3]", "(-\\infty,3]", True), ("3, 5", "3,5", True),
    ],
}


def math_verify_accepts(gold: str, pred: str, timeout_s: int = 5) -> bool:
    """``math-verify``'s verdict, read generously: the gold as latex (``$gold$``), the prediction as
    given and, without ``$`` or ``\\boxed``, also as latex. Main thread only (it times out by SIGALRM)."""
    from math_verify import parse, verify

    g = parse(f"${gold}$", parsing_timeout=timeout_s)
    tries = [pred] if ("$" in pred or "\\boxed" in pred or "\\fbox" in pred) else [pred, f"${pred}$"]
    return any(verify(g, parse(t, parsing_timeout=timeout_s), timeout_seconds=timeout_s) for t in tries)
