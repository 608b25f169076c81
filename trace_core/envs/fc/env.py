"""Function-calling environment, two modes chosen by the task payload.

* ``mode="sandbox"`` (multi-turn, synthetic): ``{"functions": [names], "state": {...},
  "expected_state": {...}, "answer": str, "calls": [[name, args], ...]}``. Tools run against a
  private ``World`` copy; reward 1 when the final state equals ``expected_state`` and the answer
  equals ``answer`` (normalised). With ``partial_credit``: half for each.
* ``mode="static"`` (BFCL / xLAM records): ``{"functions": [schemas], "ground_truth": [...]}``.
  A call missing a required argument or giving one the schema does not have is observed as
  ``bad_arguments`` and not recorded (BFCL rejects both whatever the values); other calls are
  recorded with the observation ``ok`` and scored by BFCL's AST rule (``fc.ast_rule``: types and
  values against the task's schemas and possible answers). The episode ends at ``<answer>`` or once
  as many valid calls as ground-truth entries were made. With ``partial_credit`` the reward is the
  share of matched entries. ``"relevance": "no_call"`` (BFCL's irrelevance categories: correct when
  no call is made) or ``"some_call"`` (relevance: correct when at least one call is made) replace
  the ground truth; the episode then ends at the first recorded call.
"""

from __future__ import annotations

from typing import Any

from trace_core.envs import actions as A
from trace_core.envs.base import StepResult, Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.episode import Tool, ToolEpisode
from trace_core.envs.fc.ast_rule import find_schema
from trace_core.envs.fc.bfcl import required_value
from trace_core.envs.fc.check import ast_match, schema_error, to_json_schema
from trace_core.envs.fc.world import SCHEMAS, World
from trace_core.envs.prompts import compact_signature, system_prompt
from trace_core.envs.qa.answers import normalise_qa


def _sandbox_tool(world: World, name: str) -> Tool:
    schema = SCHEMAS[name]
    return Tool(name, compact_signature(schema), schema, lambda **kw: world.call(name, kw))


def _static_tool(schema: dict[str, Any]) -> Tool:
    js = {**schema, "parameters": to_json_schema(schema.get("parameters", {}))}
    return Tool(str(schema.get("name", "?")), compact_signature(schema), js, lambda **kw: ("ok", A.OK))


class FCEpisode(ToolEpisode):
    def __init__(self, task: Task, cfg: EnvConfig):
        p = task.payload
        self.mode = p.get("mode", "sandbox")
        if self.mode == "sandbox":
            self.world = World(p.get("state", {}))
            tools = [_sandbox_tool(self.world, n) for n in p.get("functions", []) if n in SCHEMAS]
        else:
            tools = [_static_tool(s) for s in p.get("functions", []) if isinstance(s, dict)]
        self.tools = {t.name: t for t in tools}
        super().__init__(task, cfg, system_prompt(tools, cfg.prompt_style))

    def validate(self, tool: Tool, args: dict[str, Any]) -> str | None:
        if self.mode == "sandbox":
            return schema_error(tool.schema.get("parameters", {}), args)
        params = tool.schema.get("parameters", {})
        props = params.get("properties", {}) if isinstance(params, dict) else {}
        missing = [r for r in params.get("required", []) if r not in args] if isinstance(params, dict) else []
        if missing:
            return f"missing required argument {str(missing[0])[:40]}"
        extra = [k for k in args if k not in props]
        return f"unknown argument {str(extra[0])[:40]}" if extra else None

    def on_tool_result(self, name: str, args: dict[str, Any], obs: str, reason: str) -> StepResult | None:
        gt = self.task.payload.get("ground_truth", [])
        if self.mode == "static" and len(self.tool_calls) >= max(1, len(gt)):
            reward, reason, info = self.finish("")
            return self._end(reward, reason, info)
        return None

    def finish(self, answer: str) -> tuple[float, str, dict[str, Any]]:
        p = self.task.payload
        if self.mode == "static" and p.get("relevance") in ("no_call", "some_call"):
            ok = bool(self.tool_calls) == (p["relevance"] == "some_call")
            reason = A.CORRECT if ok else (A.NO_CALL if not self.tool_calls else A.WRONG_CALL)
            return float(ok), reason, {"matched": int(ok), "n_calls": len(self.tool_calls)}
        if self.mode == "static":
            gt = p.get("ground_truth", [])
            matched, exact = ast_match(self.tool_calls, gt, p.get("functions"))
            frac = matched / max(1, len(gt))
            reward = frac if self.cfg.partial_credit else float(exact)
            reason = A.CORRECT if exact else (A.NO_CALL if not self.tool_calls else A.WRONG_CALL)
            return reward, reason, {"matched": matched, "n_calls": len(self.tool_calls)}
        state_ok = self.world.state == p.get("expected_state")
        answer_ok = normalise_qa(answer) == normalise_qa(str(p.get("answer", "")))
        if state_ok and answer_ok:
            return 1.0, A.CORRECT, {"state_ok": True, "answer_ok": True}
        reason = A.WRONG_STATE if not state_ok else A.WRONG_ANSWER
        reward = 0.5 * (state_ok + answer_ok) if self.cfg.partial_credit else 0.0
        return reward, reason, {"state_ok": state_ok, "answer_ok": answer_ok}


class FCEnv:
    name = "fc"

    def __init__(self, cfg: EnvConfig):
        self.cfg = cfg

    def reset(self, task: Task) -> FCEpisode:
        return FCEpisode(task, self.cfg)


def demonstration(task: Task) -> list[str]:
    """Sandbox: the generator's calls, then the answer. Static (BFCL / xLAM): the first allowed
    value of each argument ('' = omit; an optional one the schema lacks is left out; a required
    one allowing only '' gets the empty value BFCL accepts; a nested dict takes the first allowed
    value of each key), and no answer turn: the episode ends after the last ground-truth call.
    Relevance tasks: an answer (no call) or a call of the first function with its required
    arguments' first enum value or an empty value of their type."""
    p = task.payload
    if p.get("mode", "sandbox") == "sandbox":
        return [A.format_call(n, a) for n, a in p["calls"]] + [A.format_answer(p["answer"])]
    if p.get("relevance") == "no_call":
        return [A.format_answer("none of the functions applies")]
    if p.get("relevance") == "some_call":
        return [A.format_call(*_some_call(p.get("functions", [])))]
    out = []
    for entry in p["ground_truth"]:
        (fn, spec), = entry.items()
        schema = find_schema(p.get("functions"), fn) or {}
        props = (schema.get("parameters") or {}).get("properties")
        args = {}
        required = (schema.get("parameters") or {}).get("required") or []
        for k, allowed in spec.items():
            allowed = allowed if isinstance(allowed, list) else [allowed]
            if isinstance(props, dict) and k not in props and "" in allowed:
                continue  # an answer key the schema lacks (BFCL data has a few): leave it out
            given = [a for a in allowed if a != ""]
            give, value = (bool(given), given[0] if given else None)
            if k in required:
                give, value = required_value((props or {}).get(k, {}), allowed)
            if give:
                args[k] = first_allowed(value)
        out.append(A.format_call(fn, args))
    return out


def first_allowed(value: Any) -> Any:
    """A concrete value from a possible answer: a dict of allowed-value lists (BFCL's nested-dict
    answers) takes the first allowed value of each key ('' = omit), lists of such dicts element-wise."""
    if isinstance(value, dict) and value and all(isinstance(a, list) for a in value.values()):
        out = {}
        for k, allowed in value.items():
            given = [a for a in allowed if a != ""]
            if given:
                out[k] = given[0]
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) and v for v in value):
        return [first_allowed(v) for v in value]
    return value


_EMPTY = {"string": "", "integer": 0, "float": 0.0, "number": 0.0, "boolean": False, "array": [], "tuple": [],
          "dict": {}, "object": {}}


def _some_call(functions: list[Any]) -> tuple[str, dict[str, Any]]:
    f = next((f for f in functions if isinstance(f, dict)), {"name": "?", "parameters": {}})
    params = f.get("parameters") if isinstance(f.get("parameters"), dict) else {}
    props = params.get("properties", {})
    args = {}
    for r in params.get("required", []):
        spec = props.get(r, {}) if isinstance(props.get(r), dict) else {}
        enum = spec.get("enum")
        args[r] = enum[0] if isinstance(enum, list) and enum else _EMPTY.get(spec.get("type"), "")
    return str(f.get("name", "?")), args
