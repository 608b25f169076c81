"""BFCL's AST rule, reimplemented (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``, Python language).

A call ``(name, args)`` is judged against one possible-answer entry ``{fn: {arg: [allowed, ...]}}``
with the function's schema (BFCL types ``string integer float boolean array tuple dict any``; the
JSON Schema names ``number`` / ``object`` of xLAM schemas map to ``float`` / ``dict``):

* the name equals the schema's name; every schema-``required`` argument is given; every given
  argument is in the schema and in the entry; an entry argument not given must allow ``""``;
* type: an ``int`` given for ``float`` is converted; the value's Python type must equal the schema
  type (``bool`` is not ``int``) — or equal the type of the entry's first non-``""`` value (a
  *variable*: then the value is compared with ``==`` only). Arrays check their items' types (one
  level, each against a list answer);
* value: strings are *standardised* (spaces and ``,./-_*^`` removed, lower case, ``'`` -> ``"``)
  — enums included; lists standardise their top-level strings and compare with ``==``; a dict is
  checked per key against the answer's allowed-value list for that key (a missing key must allow
  ``""``); lists of dicts per position; other values with Python's ``==`` (so ``0.0 == 0``);
* calls (``match_calls``): the number of calls equals the number of entries, and each entry in
  order takes the first not-yet-taken call that matches it (BFCL's greedy no-order rule).

The values come from bounded JSON (``actions.loads_bounded``), so ``==`` on them is bounded too.
BFCL's own code is never imported at run time (tests compare the two on BFCL's data).
"""

from __future__ import annotations

import re
from typing import Any

_PY_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                              "tuple": list, "dict": dict, "any": str, "number": float, "object": dict}
_STD = re.compile(r"[ ,./\-_*^]")


def standardize(s: str) -> str:
    """BFCL's ``standardize_string``: drop spaces and ``,./-_*^``, lower-case, ``'`` -> ``"``."""
    return _STD.sub("", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize(v) if type(v) is str else v


def _answer_type(allowed: list) -> type | None:
    return next((type(a) for a in allowed if a != ""), None)


def _type_ok(value: Any, allowed: list, want: type, nested: type | None) -> tuple[bool, bool]:
    """``(valid, is_variable)`` as BFCL's ``type_checker`` (nested: one level, for arrays)."""
    a_type = _answer_type(allowed)
    variable = a_type is not None and a_type is not want
    if type(value) is want:
        if nested is None:
            return True, variable
        for item in allowed:
            if type(item) is not list or all(_type_ok(v, item, nested, None)[0] for v in value):
                return True, variable
        return False, variable
    return (a_type is not None and type(value) is a_type), True


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, str)) else []


def _allows_omit(allowed: Any) -> bool:
    """BFCL's ``"" in allowed`` (a list member, a substring of a string, a dict key)."""
    return isinstance(allowed, (list, str, dict)) and "" in allowed


def _string_ok(value: str, allowed: list) -> bool:
    return standardize(value) in [standardize(a) for a in allowed if type(a) is str]


def _list_ok(value: list, allowed: list) -> bool:
    return [_std(v) for v in value] in [[_std(x) for x in _as_list(a)] for a in allowed]


def _dict_ok(value: Any, allowed: list) -> bool:
    if not isinstance(value, dict):
        return False
    for answer in allowed:
        if answer == "" or not isinstance(answer, dict):
            continue
        if all(k in answer and _std(v) in [_std(x) for x in _as_list(answer[k])] for k, v in value.items()) \
                and all(k in value or _allows_omit(ok) for k, ok in answer.items()):
            return True
    return False


def _list_of_dicts_ok(value: list, allowed: list) -> bool:
    for answer in allowed:
        seq = _as_list(answer)
        if len(seq) == len(value) and all(_dict_ok(v, [a]) for v, a in zip(value, seq, strict=True)):
            return True
    return False


def _param_ok(value: Any, allowed: list, spec: dict[str, Any]) -> bool:
    t = spec.get("type") if isinstance(spec, dict) else None
    want = _PY_TYPES.get(t, str) if isinstance(t, str) else str
    items = spec.get("items") if want is list else None
    nested = _PY_TYPES.get(items.get("type"), str) if isinstance(items, dict) and items.get("type") else None
    if t == "tuple" and type(value) is tuple:
        value = list(value)
    if want is float and type(value) is int:
        value = float(value)
    ok, variable = _type_ok(value, allowed, want, nested)
    if not ok:
        return False
    if not variable:
        if want is dict:
            return _dict_ok(value, allowed)
        if want is list and nested is dict:
            return _list_of_dicts_ok(value, allowed)
        if want is str:
            return _string_ok(value, allowed)
        if want is list:
            return _list_ok(value, allowed)
    return value in allowed


def call_matches(name: str, args: Any, entry: Any, schema: dict[str, Any] | None = None) -> bool:
    """One call against one possible-answer entry; ``schema`` = the function's BFCL schema (when
    None, one is inferred from the entry: every argument optional, typed by its first answer)."""
    if not isinstance(entry, dict) or len(entry) != 1 or not isinstance(args, dict):
        return False
    (fn, spec), = entry.items()
    if not isinstance(spec, dict):
        return False
    schema = schema if isinstance(schema, dict) else _inferred_schema(fn, spec)
    params = schema.get("parameters") if isinstance(schema.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = params.get("required") if isinstance(params.get("required"), list) else []
    if name != schema.get("name") or any(r not in args for r in required):
        return False
    for arg, value in args.items():
        if arg not in props or arg not in spec or not _param_ok(value, _as_list(spec[arg]), props[arg]):
            return False
    return all(arg in args or _allows_omit(allowed) for arg, allowed in spec.items())


_TYPE_NAMES = {str: "string", int: "integer", float: "float", bool: "boolean", list: "array", dict: "dict"}


def _inferred_schema(fn: str, spec: dict[str, Any]) -> dict[str, Any]:
    props = {}
    for arg, allowed in spec.items():
        t = _answer_type(_as_list(allowed))
        props[arg] = {"type": _TYPE_NAMES.get(t, "any")} if t is not None else {"type": "any"}
    return {"name": fn, "parameters": {"type": "dict", "properties": props, "required": []}}


def as_possible_answer(value: Any) -> Any:
    """A literal argument value (xLAM's answers) in BFCL's possible-answer form: a dict lists its
    one allowed value per key (BFCL checks a dict-typed argument key by key). Other values stay as
    they are (a list is compared whole: xLAM schemas give no item types)."""
    return {k: [v] for k, v in value.items()} if isinstance(value, dict) else value


def find_schema(functions: list[Any] | None, name: str) -> dict[str, Any] | None:
    for f in functions or []:
        if isinstance(f, dict) and f.get("name") == name:
            return f
    return None


def match_calls(calls: list[tuple[str, Any]], ground_truth: list[Any],
                functions: list[Any] | None = None) -> tuple[int, bool]:
    """``(entries matched, exact)``: BFCL's rule — same count, each entry in order takes the first
    free call that matches it. ``matched`` counts entries matched that way (for partial credit)."""
    calls, gts = calls[:64], ground_truth[:64]
    taken: set[int] = set()
    for entry in gts:
        fn = next(iter(entry), None) if isinstance(entry, dict) else None
        schema = find_schema(functions, fn) if functions is not None else None
        for j, (name, args) in enumerate(calls):
            if j not in taken and call_matches(name, args, entry, schema if functions is not None else None):
                taken.add(j)
                break
    return len(taken), len(taken) == len(gts) == len(calls)
