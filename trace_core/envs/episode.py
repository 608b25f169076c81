"""Shared episode machinery: limits, strict parsing, tool dispatch with a time limit.

A family env subclasses ``ToolEpisode`` and supplies ``tools`` (name -> ``Tool``) and
``finish(answer_text) -> (reward, reason, info)``. ``step`` then:

1. refuses input after the end (``episode_over``) and over-long turns (``action_too_long``);
2. counts the turn and its tokens; past ``max_turns`` / ``max_tokens_per_episode`` the episode
   ends with ``turn_limit`` / ``token_limit`` (reward 0);
3. parses the action; malformed -> ends with the parser's reason (reward 0) unless
   ``on_malformed == "observe"``, which shows an error observation and continues;
4. an answer ends the episode with ``finish``; a tool call runs with ``tool_timeout_s`` and its
   output (truncated to ``max_observation_chars``) is the observation.

Token counting: ``step(action, n_tokens=...)`` uses the engine's count when given; otherwise,
and for observations, ``approx_tokens`` (~4 characters a token) is used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import Any

from trace_core.envs import actions as A
from trace_core.envs.base import StepResult, Task
from trace_core.envs.config import EnvConfig


@dataclass(frozen=True)
class Tool:
    """A callable tool. ``fn(**arguments) -> (observation, reason)``; reason OK or a tool reason."""

    name: str
    signature: str  # compact form, e.g. "calculator(expression)"
    schema: dict[str, Any]  # JSON schema of the function (OpenAI / Qwen3 "function" object)
    fn: Callable[..., tuple[str, str]]


def approx_tokens(text: str) -> int:
    return (len(text) + 3) // 4


_POOL: list[ThreadPoolExecutor] = [ThreadPoolExecutor(max_workers=4, thread_name_prefix="tool")]
_POOL_LOCK = threading.Lock()


def _guarded(fn: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    try:
        return fn()
    except Exception:  # a tool bug must not kill the rollout
        return "error: internal", A.INTERNAL_ERROR


def call_with_timeout(fn: Callable[[], tuple[str, str]], timeout_s: float) -> tuple[str, str]:
    """Run ``fn`` on a worker thread; ``("error: timeout", tool_timeout)`` if it overruns.

    Tools are bounded by construction (input sizes, integer bits); the time limit is a second
    line of defence. Workers are reused (~0.12 ms a call vs ~0.45 ms for a fresh thread); when a call
    overruns, its pool is abandoned (the stuck thread finishes or dies with the process) and a
    new pool serves later calls, so one runaway call cannot starve the others.
    """
    pool = _POOL[0]
    try:
        fut = pool.submit(_guarded, fn)
    except RuntimeError:  # pool shut down concurrently
        return _guarded(fn)
    try:
        return fut.result(timeout=timeout_s)
    except FuturesTimeout:
        with _POOL_LOCK:
            if _POOL[0] is pool:
                _POOL[0] = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tool")
                pool.shutdown(wait=False, cancel_futures=True)
        return "error: timeout", A.TOOL_TIMEOUT


def validate_arguments(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """Light JSON-schema check of tool arguments (required, no extras, basic types); error or None."""
    params = schema.get("parameters", {})
    props = params.get("properties", {})
    for req in params.get("required", []):
        if req not in args:
            return f"missing argument {req}"
    for k, v in args.items():
        if k not in props:
            return f"unknown argument {str(k)[:40]}"
        want = props[k].get("type")
        if want == "string" and not isinstance(v, str):
            return f"{k} must be a string"
        if want == "integer" and (isinstance(v, bool) or not isinstance(v, int)):
            return f"{k} must be an integer"
    return None


class ToolEpisode:
    """Base episode. Subclasses set ``self.tools`` and implement ``finish``."""

    tools: dict[str, Tool]

    def __init__(self, task: Task, cfg: EnvConfig, system_prompt: str):
        self.task, self.cfg, self._system = task, cfg, system_prompt
        self.turns = 0
        self.tokens = 0
        self.done = False
        self.tool_calls: list[tuple[str, dict[str, Any]]] = []  # calls that ran, in order
        self.tool_errors = 0

    # -- protocol ---------------------------------------------------------
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self._system}, {"role": "user", "content": self.task.question}]

    def step(self, action_text: str, n_tokens: int | None = None) -> StepResult:
        if self.done:
            return StepResult(None, True, 0.0, A.EPISODE_OVER)
        try:
            return self._step(action_text, n_tokens)
        except Exception as exc:  # never let model text crash the rollout; record it
            self.done = True
            return StepResult(None, True, 0.0, A.INTERNAL_ERROR, {"error": type(exc).__name__})

    # -- hooks ------------------------------------------------------------
    def finish(self, answer: str) -> tuple[float, str, dict[str, Any]]:
        raise NotImplementedError

    def validate(self, tool: Tool, args: dict[str, Any]) -> str | None:
        """Argument check before a tool runs (error text or None); FC overrides with JSON Schema."""
        return validate_arguments(tool.schema, args)

    def on_tool_result(self, name: str, args: dict[str, Any], obs: str, reason: str) -> StepResult | None:
        """Subclass hook after a tool ran; return a StepResult to end the episode there."""
        return None

    # -- internals --------------------------------------------------------
    def _end(self, reward: float, reason: str, info: dict[str, Any] | None = None) -> StepResult:
        self.done = True
        return StepResult(None, True, float(reward), reason, {"turns": self.turns, **(info or {})})

    def _step(self, action_text: str, n_tokens: int | None) -> StepResult:
        cfg = self.cfg
        self.turns += 1
        if not isinstance(action_text, str):
            return self._end(0.0, A.NO_ACTION)
        self.tokens += n_tokens if n_tokens is not None else approx_tokens(action_text[: cfg.max_action_chars + 1])
        if len(action_text) > cfg.max_action_chars:
            return self._end(0.0, A.ACTION_TOO_LONG)
        if self.tokens > cfg.max_tokens_per_episode:
            return self._end(0.0, A.TOKEN_LIMIT)
        act = A.parse_action(action_text, cfg.max_action_chars)
        if act.kind == "answer":
            reward, reason, info = self.finish(act.text)
            return self._end(reward, reason, {"answer": act.text[:200], **info})
        if act.kind == "invalid":
            if cfg.on_malformed == "end":
                return self._end(0.0, act.reason)
            return self._observe(f"error: {act.reason}", act.reason, {"malformed": True})
        tool = self.tools.get(act.name)
        if tool is None:
            if cfg.on_malformed == "end":
                return self._end(0.0, A.UNKNOWN_TOOL, {"tool": act.name[:40]})
            return self._observe(f"error: unknown tool {act.name[:40]}", A.UNKNOWN_TOOL, {"tool_error": True})
        err = self.validate(tool, act.arguments)
        if err is not None:
            self.tool_errors += 1
            return self._observe(f"error: {err}", A.BAD_ARGUMENTS, {"tool_error": True, "tool": tool.name})
        obs, reason = call_with_timeout(lambda: tool.fn(**act.arguments), cfg.tool_timeout_s)
        self.tool_calls.append((tool.name, act.arguments))
        if reason != A.OK:
            self.tool_errors += 1
        ended = self.on_tool_result(tool.name, act.arguments, obs, reason)
        if ended is not None:
            return ended
        return self._observe(obs, reason, {"tool": tool.name, "tool_error": reason != A.OK})

    def _observe(self, obs: str, reason: str, info: dict[str, Any]) -> StepResult:
        obs = obs[: self.cfg.max_observation_chars]
        self.tokens += approx_tokens(obs)
        if self.turns >= self.cfg.max_turns:
            return self._end(0.0, A.TURN_LIMIT, info)
        if self.tokens > self.cfg.max_tokens_per_episode:
            return self._end(0.0, A.TOKEN_LIMIT, info)
        return StepResult(obs, False, 0.0, reason, {"turns": self.turns, **info})
