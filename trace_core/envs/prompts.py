"""System prompts: 'compact' (one line, for the tiny policy) or 'full' (Qwen3 tool-calling layout)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trace_core.envs.episode import Tool

_FULL_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_FULL_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
    "Call one function per turn and wait for its result. When done, give the final answer "
    "as <answer>...</answer>."
)


def system_prompt(tools: Sequence[Tool], style: str) -> str:
    """``compact``: ``tools: calculator(expression)``; ``full``: the JSON schemas, one per line."""
    if style == "compact":
        return "tools: " + ", ".join(t.signature for t in tools)
    lines = "\n".join(json.dumps({"type": "function", "function": t.schema}, ensure_ascii=False) for t in tools)
    return _FULL_HEAD + lines + _FULL_TAIL


def function_schema(name: str, description: str, **params: tuple[str, str]) -> dict[str, Any]:
    """A tool's JSON schema (the OpenAI / Qwen3 "function" object); ``param=(json_type,
    description)``, every parameter required, in the order given."""
    props = {p: {"type": t, "description": d} for p, (t, d) in params.items()}
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": props, "required": list(params)},
    }


def compact_signature(schema: dict) -> str:
    """``name(a, b)`` from a function schema (required args first, optional ones with ``?``)."""
    params = schema.get("parameters", {}) or {}
    props = params.get("properties", {}) or {}
    req = [p for p in params.get("required", []) if p in props]
    opt = [f"{p}?" for p in props if p not in req]
    return f"{schema.get('name', '?')}({', '.join(req + opt)})"
