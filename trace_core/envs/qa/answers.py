"""QA answer checks: SQuAD-normalised exact match and token F1.

Every function takes any string and returns a value; none raises. Inputs are truncated to
``MAX_ANSWER_CHARS`` first so the cost per check is bounded.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from trace_core.envs.actions import CORRECT, EMPTY_ANSWER, MAX_ANSWER_CHARS, WRONG_ANSWER

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalise_qa(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = text[:MAX_ANSWER_CHARS].lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def token_f1(pred: str, gold: str) -> float:
    p, g = normalise_qa(pred).split(), normalise_qa(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return float(p == g)
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def check_qa(pred: object, golds: list[str]) -> tuple[float, str, dict]:
    """``(reward, reason, info)``: reward = normalised exact match against any gold; info has em, f1."""
    if not isinstance(pred, str) or not normalise_qa(pred):
        return 0.0, EMPTY_ANSWER, {"em": 0.0, "f1": 0.0}
    em = max((float(normalise_qa(pred) == normalise_qa(g)) for g in golds), default=0.0)
    f1 = max((token_f1(pred, g) for g in golds), default=0.0)
    return em, (CORRECT if em else WRONG_ANSWER), {"em": em, "f1": f1}
