"""Strict parser for one assistant turn, and the reason codes every env outcome uses.

An action is the first complete marker in the turn (free text before it is the thought):

* ``<tool_call>{"name": str, "arguments": {...}}</tool_call>``  -> ``Action(kind="tool_call")``
* ``<answer>text</answer>``                                     -> ``Action(kind="answer")``

A leading ``<think>...</think>`` block (Qwen3 thinking mode) is skipped so a marker quoted
inside the thought is not taken as the action. Text after the closing tag is ignored (the
engine stops on it). Parsing never raises and runs in time linear in the (bounded) input:
markers are found with ``str.find`` (no backtracking regex), the JSON nesting depth is
scanned before ``json.loads`` so deeply nested input cannot hit the recursion limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Reason codes (StepResult.reason). Kept as plain strings so they land in Parquet as-is.
OK = "ok"  # tool ran, episode continues
CORRECT = "correct"
WRONG_ANSWER = "wrong_answer"
EMPTY_ANSWER = "empty_answer"
UNPARSABLE_ANSWER = "unparsable_answer"
NO_ACTION = "no_action"  # neither marker present
MALFORMED_JSON = "malformed_json"
MALFORMED_CALL = "malformed_call"  # JSON fine but not {"name": str, "arguments": dict}
UNKNOWN_TOOL = "unknown_tool"
BAD_ARGUMENTS = "bad_arguments"  # schema validation failed
TOOL_ERROR = "tool_error"  # tool ran and reported an error (observation says which)
TOOL_TIMEOUT = "tool_timeout"
ACTION_TOO_LONG = "action_too_long"
TURN_LIMIT = "turn_limit"
TOKEN_LIMIT = "token_limit"
EPISODE_OVER = "episode_over"  # step() after the episode ended
WRONG_STATE = "wrong_state"  # FC sandbox: final state differs from the expected one
WRONG_CALL = "wrong_call"  # FC static: calls do not match the ground truth (BFCL AST rule)
NO_CALL = "no_call"  # FC static: answered without a valid call
INTERNAL_ERROR = "internal_error"  # a bug in a tool; caught so the rollout survives

MALFORMED_REASONS = frozenset({NO_ACTION, MALFORMED_JSON, MALFORMED_CALL, ACTION_TOO_LONG})

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
MAX_JSON_DEPTH = 16
MAX_ANSWER_CHARS = 512  # answer checks read at most this much of an answer (bounded cost)


@dataclass(frozen=True)
class Action:
    kind: str  # 'tool_call' | 'answer' | 'invalid'
    reason: str = OK  # for 'invalid': why
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the answer text (kind='answer') or the raw call JSON


def json_depth_ok(text: str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """True if bracket nesting (outside JSON strings) stays within ``max_depth``. O(len)."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads_bounded(text: str, max_chars: int = 8192, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, str]:
    """``(value, OK)`` or ``(None, reason)``; never raises."""
    if len(text) > max_chars:
        return None, ACTION_TOO_LONG
    if not json_depth_ok(text, max_depth):
        return None, MALFORMED_JSON
    try:
        return json.loads(text), OK
    except (ValueError, RecursionError):
        return None, MALFORMED_JSON


def _skip_think(text: str) -> str:
    head = text.lstrip()
    if head.startswith("<think>"):
        end = head.find("</think>")
        return head[end + len("</think>") :] if end >= 0 else ""
    return text


def parse_action(text: Any, max_chars: int = 16384) -> Action:
    """Parse one assistant turn. Any input (even non-str) gives an Action; never raises."""
    if not isinstance(text, str):
        return Action("invalid", NO_ACTION)
    if len(text) > max_chars:
        return Action("invalid", ACTION_TOO_LONG)
    body = _skip_think(text)
    t_pos, a_pos = body.find(TOOL_OPEN), body.find(ANSWER_OPEN)
    if t_pos < 0 and a_pos < 0:
        return Action("invalid", NO_ACTION)
    if a_pos >= 0 and (t_pos < 0 or a_pos < t_pos):
        start = a_pos + len(ANSWER_OPEN)
        end = body.find(ANSWER_CLOSE, start)
        if end < 0:
            return Action("invalid", NO_ACTION)
        return Action("answer", OK, text=body[start:end].strip())
    start = t_pos + len(TOOL_OPEN)
    end = body.find(TOOL_CLOSE, start)
    if end < 0:
        return Action("invalid", NO_ACTION)
    raw = body[start:end].strip()
    obj, reason = loads_bounded(raw)
    if reason != OK:
        return Action("invalid", reason, text=raw[:200])
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return Action("invalid", MALFORMED_CALL, text=raw[:200])
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments JSON-encoded once more
        args, reason = loads_bounded(args)
        if reason != OK:
            return Action("invalid", MALFORMED_CALL, text=raw[:200])
    if not isinstance(args, dict) or set(obj) - {"name", "arguments"}:
        return Action("invalid", MALFORMED_CALL, text=raw[:200])
    return Action("tool_call", OK, name=obj["name"], arguments=args, text=raw)


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical action string for a tool call (what demonstrations use)."""
    return f"{TOOL_OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{TOOL_CLOSE}"


def format_answer(answer: Any) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
