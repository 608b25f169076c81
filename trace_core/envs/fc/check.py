"""Function-call checks: BFCL schemas -> JSON Schema validation, and BFCL's AST rule.

BFCL ground truth is ``[{fn_name: {arg: [allowed values]}}]``; an allowed value ``""`` means the
argument may be omitted. The rule itself (types from the schema, string standardisation, nested
dicts per key, the count and greedy matching of calls) is in ``ast_rule``; tests check that it
agrees with BFCL's own checker on BFCL's data. ``bfcl-eval`` is never imported here.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema

from trace_core.envs.fc.ast_rule import call_matches, match_calls, standardize

_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array", "int": "integer", "str": "string",
             "bool": "boolean", "list": "array"}


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


def ast_match(calls: list[tuple[str, dict[str, Any]]], ground_truth: list[dict[str, Any]],
              functions: list[dict[str, Any]] | None = None) -> tuple[int, bool]:
    """``(matched entries, exact)`` by BFCL's AST rule (``ast_rule.match_calls``); ``functions`` are
    the task's BFCL schemas (types, required arguments), inferred from the answers when None."""
    return match_calls(calls, ground_truth, functions)


__all__ = ["ast_match", "call_matches", "schema_error", "standardize", "to_json_schema"]
