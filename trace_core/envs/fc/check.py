"""Function-call checks: BFCL schemas -> JSON Schema validation, and BFCL's AST rule.

BFCL ground truth is ``[{fn_name: {arg: [allowed values]}}]``; an allowed value ``""`` means the
argument may be omitted. A predicted call matches a ground-truth entry when the function name is
the same, it has no argument the entry does not list, every argument it omits is optional, and
every value it gives equals one allowed value (strings compared case- and punctuation-
insensitively; an int is accepted where a float is expected; lists and dicts element-wise).
Calls match as a set (order-free, for parallel calls); a task is correct when every ground-truth
entry is matched by a distinct call and no call is left over. Our own implementation of the
published rule; ``bfcl-eval`` is not imported.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jsonschema

_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array", "int": "integer", "str": "string",
             "bool": "boolean", "list": "array"}
_STRIP = re.compile(r"[ ,./\-_*^'\"]")


def to_json_schema(params: Any) -> dict[str, Any]:
    """BFCL / xLAM parameter schema -> JSON Schema (``dict``->object, ``float``->number, ``any``->{})."""
    if not isinstance(params, dict):
        return {}
    out: dict[str, Any] = {}
    t = params.get("type")
    if isinstance(t, str) and t != "any":
        out["type"] = _TYPE_MAP.get(t, t)
    if isinstance(params.get("properties"), dict):
        out["properties"] = {k: to_json_schema(v) for k, v in params["properties"].items()}
        out["additionalProperties"] = False
    if isinstance(params.get("required"), list):
        out["required"] = [r for r in params["required"] if isinstance(r, str)]
    if isinstance(params.get("items"), dict):
        out["items"] = to_json_schema(params["items"])
    if isinstance(params.get("enum"), list):
        out["enum"] = params["enum"]
    if out.get("type") not in (None, "object", "array", "string", "integer", "number", "boolean", "null"):
        out.pop("type")  # an unknown type name in the source schema: accept any value
    return out


@lru_cache(maxsize=4096)
def _validator_for_json(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


_BY_ID: dict[int, tuple[dict, jsonschema.protocols.Validator]] = {}  # fast path: same schema object


def _validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    hit = _BY_ID.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    v = _validator_for_json(json.dumps(schema, sort_keys=True))
    if len(_BY_ID) > 4096:
        _BY_ID.clear()
    _BY_ID[id(schema)] = (schema, v)  # holding the schema keeps its id from being reused
    return v


def schema_error(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """First JSON Schema violation of ``args`` (short message) or None. Validators are cached."""
    try:
        err = next(iter(_validator(schema).iter_errors(args)), None)
    except (jsonschema.exceptions.SchemaError, RecursionError, ValueError, TypeError):
        return "invalid schema"
    return None if err is None else err.message[:120]


def _std(s: str) -> str:
    return _STRIP.sub("", s.lower())


def value_match(v: Any, allowed: Any) -> bool:
    if isinstance(allowed, bool) or isinstance(v, bool):
        return type(v) is type(allowed) and v == allowed
    if isinstance(allowed, str):
        return isinstance(v, str) and _std(v) == _std(allowed)
    if isinstance(allowed, (int, float)):
        if not isinstance(v, (int, float)):
            return False
        if isinstance(allowed, int) and isinstance(v, float):
            return False  # a float where an int is expected is wrong (BFCL)
        return float(v) == float(allowed)
    if isinstance(allowed, (list, tuple)):
        return isinstance(v, (list, tuple)) and len(v) == len(allowed) and all(
            value_match(a, b) for a, b in zip(v, allowed, strict=True))
    if isinstance(allowed, dict):
        return isinstance(v, dict) and set(v) == set(allowed) and all(value_match(v[k], allowed[k]) for k in v)
    return v == allowed


def call_matches(name: str, args: dict[str, Any], gt: dict[str, Any]) -> bool:
    """One predicted call against one ground-truth entry ``{fn: {arg: [allowed, ...]}}``."""
    if len(gt) != 1:
        return False
    (fn, spec), = gt.items()
    if name != fn or not isinstance(spec, dict) or set(args) - set(spec):
        return False
    for arg, allowed in spec.items():
        allowed = allowed if isinstance(allowed, list) else [allowed]
        if arg not in args:
            if "" not in allowed:
                return False
        elif not any(value_match(args[arg], a) for a in allowed if not (a == "" and args[arg] != "")):
            return False
    return True


def ast_match(calls: list[tuple[str, dict[str, Any]]], ground_truth: list[dict[str, Any]]) -> tuple[int, bool]:
    """``(matched entries, exact)``: max distinct matches (backtracking, n <= 8 in practice)."""
    calls, gts = calls[:16], ground_truth[:16]
    ok = [[call_matches(n, a, g) for (n, a) in calls] for g in gts]

    best = 0

    def go(i: int, used: frozenset[int], got: int) -> None:
        nonlocal best
        best = max(best, got)
        if i == len(gts) or got + (len(gts) - i) <= best:
            return
        for j in range(len(calls)):
            if j not in used and ok[i][j]:
                go(i + 1, used | {j}, got + 1)
        go(i + 1, used, got)

    go(0, frozenset(), 0)
    return best, best == len(gts) == len(calls)
