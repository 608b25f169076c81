"""Math answer checks: numeric / fraction / boxed / units equivalence, GSM8K final answers.

Every function takes any string and returns a value; none raises. Inputs are truncated to
``MAX_ANSWER_CHARS`` first so the cost per check is bounded (regular expressions and exact
rationals only: no parser, no ``eval``, no computer algebra).

Numbers: integers, decimals, thousands separators, currency and unit words, percentages,
degrees, ``a/b``, ``\\frac{a}{b}`` (also ``\\frac78``), mixed numbers ``1\\frac{1}{2}``, powers of ten
``3\\times10^{5}``, and a sentence holding exactly one number (``The answer is 18``). Compared as
exact rationals within a relative 1e-6. Everything else (roots, pi, intervals, expressions) is
compared as a normalised string (latex noise and spaces removed, ``\\sqrt3`` -> ``\\sqrt{3}``).

``math-verify`` is not used at run time, and this was decided by measurement
(``benchmarks/learning/verifier_agreement.py --math``; cases in ``tests/envs/math_cases.py``). It accepts
more equivalent symbolic forms (``\\sqrt{8}`` = ``2\\sqrt{2}``), but (1) its plain-expression
path hands text to sympy's string parser, which runs Python's eval on generated code (input
restricted to digits and operators, still an eval path); (2) its only time bound is ``signal.alarm`` — whole seconds,
main thread only (``parse`` raises ``ValueError`` in any other thread, where rollouts verify), and
it replaces the process's SIGALRM handler; a hostile ``9**9**9**9`` takes its full timeout
(5.0 s by default) where this module answers in microseconds. The reward must never accept a
wrong answer, so this checker stays conservative: on the hand-labelled cases it gives no false
positive, and the equivalences it misses are symbolic ones.
"""

from __future__ import annotations

import re
from fractions import Fraction

from trace_core.envs.actions import CORRECT, EMPTY_ANSWER, MAX_ANSWER_CHARS, UNPARSABLE_ANSWER, WRONG_ANSWER

_REL_TOL = Fraction(1, 10**6)  # accepts answers rounded to ~7 significant digits


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else None."""
    for key in ("\\boxed{", "\\fbox{"):
        pos = text.rfind(key)
        if pos < 0:
            continue
        i, depth = pos + len(key), 1
        start = i
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
            i += 1
        return None
    return None


_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?"
_FRAC_LATEX = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")
_MIXED = re.compile(r"^(-?)(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}$")
_POW10 = re.compile(r"^(?:(-?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot|\*|×)\s*)?10\s*\^\s*\{?\s*(-?\d{1,3})\s*\}?$")
_NUM_TOKEN = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
_NEGATION = re.compile(r"(?i)\b(?:not|no|never|neither|nor|except|without|wrong|incorrect|cannot)\b|n['’]t\b")
_WORDS = re.compile(r"[^\W\d_\s]|[\s:=,.!?'’$€£¥%]")  # what may surround the one number of a sentence


def _one_number_in_words(s: str) -> str | None:
    """The number of a sentence that holds exactly one (``The answer is 18.``, ``x = 18``), else None.
    Linear: one scan for numbers, one for the other characters (letters, spaces, light punctuation)."""
    found = []
    for m in _NUM_TOKEN.finditer(s):
        found.append(m)
        if len(found) > 1:
            return None
    if len(found) != 1:
        return None
    m = found[0]
    rest = s[: m.start()] + " " + s[m.end():]
    if len(_WORDS.sub("", rest).strip()) or not _NUMBER.match(m.group().rstrip(",")):
        return None
    if _NEGATION.search(rest):
        return None
    return m.group().rstrip(",")
_FRAC_PLAIN = re.compile(r"^(-?\d+)\s*/\s*(-?\d+)$")
_NUMBER = re.compile(rf"^({_NUM})$")
# currency up front, units / percent / a few words after: "$1,200.50", "18 dollars", "45 km/h", "50%"
_WITH_UNITS = re.compile(rf"^[$€£¥]?\s*({_NUM})\s*(?:%|[^\W\d_](?:[^\W\d_]|[/°²³.\- ]){{0,30}})?\.?$")
_LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "$", "\\displaystyle", "\\%")


def _clean_latex(s: str) -> str:
    s = s.strip().replace("\u2212", "-")  # unicode minus
    s = re.sub(r"^([-+])\s+(?=\d)", r"\1", s)  # "- 3"
    for tok in _LATEX_NOISE:
        s = s.replace(tok, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\^\{?\\circ\}?", "", s)  # degrees
    s = re.sub(r"\\(sqrt|frac)\s*(\d)", r"\\\1{\2}", s)  # a bare one-token argument: \sqrt3, \frac78
    s = re.sub(r"\\frac\{(\d+)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    return s.strip().rstrip(".").strip()


def parse_number(text: str) -> Fraction | None:
    """Exact value of a numeric answer (int, decimal, a/b, \\frac{a}{b}, with units), else None."""
    s = _clean_latex(text[:MAX_ANSWER_CHARS])
    m = _FRAC_LATEX.match(s) or _FRAC_PLAIN.match(s)
    if m:
        g = m.groups()
        sign = -1 if (len(g) == 3 and g[0] == "-") else 1
        num, den = int(g[-2]), int(g[-1])
        return None if den == 0 else sign * Fraction(num, den)
    m = _MIXED.match(s)
    if m:
        sign = -1 if m.group(1) else 1
        den = int(m.group(4))
        return None if den == 0 else sign * (int(m.group(2)) + Fraction(int(m.group(3)), den))
    m = _POW10.match(s)
    if m:
        return Fraction(m.group(1) or 1) * Fraction(10) ** int(m.group(2))
    m = _NUMBER.match(s) or _WITH_UNITS.match(s)
    num = m.group(1) if m else _one_number_in_words(s)
    if not num or not re.search(r"\d", num):
        return None
    try:
        return Fraction(num.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def normalise_math(text: str) -> str:
    """Canonical string for non-numeric answers (expressions, intervals): no spaces, no latex noise."""
    return re.sub(r"\s+", "", _clean_latex(text[:MAX_ANSWER_CHARS])).lower()


def math_answer_text(text: str) -> str:
    """The answer string a model gave: the boxed content when present, else the text."""
    text = text[:MAX_ANSWER_CHARS] if isinstance(text, str) else ""
    boxed = extract_boxed(text)
    return (boxed if boxed is not None else text).strip()


def check_math(pred: object, gold: str) -> tuple[float, str, dict]:
    """``(reward, reason, info)``: numeric equivalence if both parse, else normalised string match."""
    if not isinstance(pred, str):
        return 0.0, UNPARSABLE_ANSWER, {}
    p = math_answer_text(pred)
    if not p:
        return 0.0, EMPTY_ANSWER, {}
    g = math_answer_text(gold)
    gv, pv = parse_number(g), parse_number(p)
    if gv is not None:
        if pv is None:
            return 0.0, UNPARSABLE_ANSWER, {"pred": p[:64]}
        ok = abs(pv - gv) <= _REL_TOL * abs(gv)  # exact rationals: no float overflow on huge input
        return (1.0, CORRECT, {}) if ok else (0.0, WRONG_ANSWER, {"pred": p[:64]})
    ok = normalise_math(p) == normalise_math(g)
    return (1.0, CORRECT, {}) if ok else (0.0, WRONG_ANSWER, {"pred": p[:64]})


def gsm8k_final(answer_field: str) -> str:
    """The number after ``####`` in a GSM8K ``answer`` field (separators removed)."""
    tail = answer_field.rsplit("####", 1)[-1].strip()
    return tail.replace(",", "")
