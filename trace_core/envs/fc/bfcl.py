"""BFCL data -> tasks: ``load_bfcl(data_dir, category)`` (registered as loader ``"bfcl"``).

``data_dir`` is BFCL's data folder, e.g. ``bfcl_eval/data`` of the unpacked ``bfcl-eval`` wheel
(``scripts/fetch-bfcl-eval.sh DIR``; the wheel is never installed or imported). Questions are
``BFCL_v<N>_<category>.json`` (JSON lines ``{id, question: [[{role, content}]], function:
[schemas]}``), answers ``possible_answer/`` the same name (``{id, ground_truth: [{fn: {arg:
[allowed]}}]}``). The file name must be exactly ``BFCL_v<N>_<category>.json`` (the highest N wins),
so ``multiple`` never reads ``parallel_multiple`` nor ``irrelevance`` ``live_irrelevance``.

* AST categories (scored by BFCL's AST rule, ``fc.ast_rule``): ``simple_python``, ``multiple``,
  ``parallel``, ``parallel_multiple``, ``live_simple``, ``live_multiple``, ``live_parallel``,
  ``live_parallel_multiple``.
* ``irrelevance``, ``live_irrelevance``: no answer file; correct when the model makes no call.
  ``live_relevance``: correct when it makes at least one call (BFCL's relevance rule).
* Refused, with the reason in the error: ``simple_java`` / ``simple_javascript`` (arguments are
  Java / JavaScript source literals that BFCL parses with its language type converters, not
  implemented here), ``multi_turn_*`` (BFCL executes the calls against its simulated APIs and
  compares their states and responses turn by turn: needs a state-based checker, not implemented),
  ``memory`` / ``web_search`` (agentic: BFCL's memory backends / a live web search),
  ``format_sensitivity`` (not a data set: ids of other categories under prompt-format variations).

A malformed file or row is a one-line ``ValueError`` naming the file and line. Tasks that no call
can solve under BFCL's rule (``unsolvable``: 4 of the 2,351 AST tasks of v4 — a required argument
with no allowed value, an answer argument the schema lacks) are left out with a warning.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from trace_core.envs.base import Task

log = logging.getLogger(__name__)

AST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
                  "live_parallel", "live_parallel_multiple")
RELEVANCE_CATEGORIES = {"irrelevance": "no_call", "live_irrelevance": "no_call", "live_relevance": "some_call"}
_REFUSED = [
    (re.compile(r"simple_(java|javascript)$"), "its arguments are {0} source literals that BFCL parses with its "
     "language type converters (not implemented)"),
    (re.compile(r"multi_turn_\w+$"), "multi-turn BFCL executes the calls against its simulated APIs and compares "
     "states turn by turn; that needs a state-based checker (not implemented)"),
    (re.compile(r"memory(_\w+)?$"), "an agentic category that needs BFCL's memory backends (not implemented)"),
    (re.compile(r"web_search(_\w+)?$"), "an agentic category that needs a live web search (not implemented)"),
    (re.compile(r"format_sensitivity$"), "not a data set: it lists ids of other categories run under prompt-format "
     "variations; load those categories instead"),
]


_EMPTY_OK = {"string": "", "any": "", "array": [], "tuple": []}  # what BFCL accepts for an answer of only ''


def required_value(spec: dict[str, Any], allowed: list) -> tuple[bool, Any]:
    """``(possible, value)`` for an argument the schema requires: the first non-'' allowed value,
    else the empty value BFCL's rule accepts for '' (strings, arrays); impossible otherwise."""
    given = [a for a in allowed if a != ""]
    if given:
        return True, given[0]
    t = spec.get("type") if isinstance(spec, dict) else None
    return ("" in allowed and t in _EMPTY_OK), _EMPTY_OK.get(t) if isinstance(t, str) else None


def unsolvable(functions: list[dict[str, Any]], ground_truth: list[dict[str, Any]]) -> str | None:
    """Why no call can satisfy an answer entry under BFCL's rule (the data has a few such tasks), or
    None: a function missing from the schemas, a required argument with no usable allowed value or
    not in the answer, an answer argument the schema lacks that may not be omitted."""
    for entry in ground_truth:
        (fn, spec), = entry.items()
        schema = next((f for f in functions if f.get("name") == fn), None)
        if schema is None or not isinstance(spec, dict):
            return f"function {fn} has no schema"
        params = schema.get("parameters") if isinstance(schema.get("parameters"), dict) else {}
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        for r in params.get("required", []):
            if r not in spec or not required_value(props.get(r, {}), spec[r] if isinstance(spec[r], list) else [])[0]:
                return f"{fn}: required argument {r} has no allowed value"
        for k, allowed in spec.items():
            if k not in props and not (isinstance(allowed, list) and "" in allowed):
                return f"{fn}: answer argument {k} is not in the schema"
    return None


def _difficulty(n_functions: int, n_calls: int) -> int:
    return min(3, n_calls) if n_calls > 1 else int(n_functions > 1)


def category_file(data_dir: Path, category: str) -> Path:
    """``BFCL_v<N>_<category>.json`` in ``data_dir`` (exact category, highest N)."""
    pat = re.compile(rf"BFCL_v(\d+)_{re.escape(category)}\.json")
    found = sorted((int(m.group(1)), p) for p in data_dir.glob("BFCL_v*.json") if (m := pat.fullmatch(p.name)))
    if not found:
        raise FileNotFoundError(f"no BFCL_v<N>_{category}.json in {data_dir}")
    return found[-1][1]


def _json_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            raise ValueError(f"{path}:{n}: not a JSON line ({str(err)[:80]})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
            raise ValueError(f"{path}:{n}: not a BFCL record (an object with a string id)")
        out.append((n, rec))
    return out


def _user_text(rec: dict[str, Any]) -> str | None:
    q = rec.get("question")
    turns = q[0] if isinstance(q, list) and q and isinstance(q[0], list) else q
    user = [m.get("content") for m in turns or [] if isinstance(m, dict) and m.get("role") == "user"]
    return user[-1] if user and isinstance(user[-1], str) and user[-1].strip() else None


def load_bfcl(data_dir: str | Path, category: str = "simple_python", limit: int | None = None) -> list[Task]:
    """Tasks of one single-turn BFCL category (see the module docstring for what loads and what not)."""
    data_dir = Path(data_dir)
    for pat, why in _REFUSED:
        m = pat.fullmatch(category)
        if m:
            lang = {"java": "Java", "javascript": "JavaScript"}.get(m.group(1) if m.groups() else "", "")
            raise ValueError(f"BFCL category {category} is not supported: {why.format(lang)}")
    if category not in AST_CATEGORIES and category not in RELEVANCE_CATEGORIES:
        known = ", ".join((*AST_CATEGORIES, *RELEVANCE_CATEGORIES))
        raise ValueError(f"unknown BFCL category {category!r} (known: {known})")
    if not data_dir.is_dir():
        raise FileNotFoundError(f"BFCL data directory {data_dir} does not exist")
    qfile = category_file(data_dir, category)
    rows = _json_lines(qfile)[:limit] if limit is not None else _json_lines(qfile)
    relevance = RELEVANCE_CATEGORIES.get(category)
    answers: dict[str, Any] = {}
    afile = data_dir / "possible_answer" / qfile.name
    if relevance is None:
        if not afile.is_file():
            raise FileNotFoundError(f"no possible answers for {qfile.name}: {afile} is missing")
        answers = {r["id"]: (n, r.get("ground_truth")) for n, r in _json_lines(afile)}
    tasks: list[Task] = []
    dropped: list[str] = []
    for n, r in rows:
        functions, text = r.get("function"), _user_text(r)
        if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions) \
                or not (functions or relevance == "no_call"):
            raise ValueError(f"{qfile}:{n}: 'function' must be a list of schemas (non-empty unless irrelevance)")
        if text is None:
            raise ValueError(f"{qfile}:{n}: no user message in 'question'")
        payload: dict[str, Any] = {"mode": "static", "functions": functions, "source": "bfcl", "category": category}
        if relevance is not None:
            payload.update(ground_truth=[], relevance=relevance)
        else:
            if r["id"] not in answers:
                raise ValueError(f"{qfile}:{n}: id {r['id'][:60]} has no entry in {afile}")
            an, gt = answers[r["id"]]
            if not isinstance(gt, list) or not gt or not all(isinstance(e, dict) and len(e) == 1 for e in gt):
                raise ValueError(f"{afile}:{an}: ground_truth must be a list of {{function: {{arg: [allowed]}}}}")
            payload["ground_truth"] = gt
            why = unsolvable(functions, gt)
            if why is not None:
                dropped.append(f"{r['id'][:40]} ({why[:80]})")
                continue
        tasks.append(Task(f"bfcl-{r['id']}", "fc", _difficulty(len(functions), len(payload["ground_truth"])),
                          text, payload))
    if dropped:
        log.warning("%s: %d task(s) no call can solve under BFCL's rule left out: %s", qfile.name, len(dropped),
                    "; ".join(dropped[:3]) + ("; ..." if len(dropped) > 3 else ""))
    return tasks
