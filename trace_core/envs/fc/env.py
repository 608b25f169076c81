"""Function-calling environment, two modes chosen by the task payload.

* ``mode="sandbox"`` (multi-turn, synthetic): ``{"functions": [names], "state": {...},
  "expected_state": {...}, "answer": str, "calls": [[name, args], ...]}``. Tools run against a
  private ``World`` copy; reward 1 when the final state equals ``expected_state`` and the answer
  equals ``answer`` (normalised). With ``partial_credit``: half for each.
* ``mode="static"`` (BFCL / xLAM records): ``{"functions": [schemas], "ground_truth": [...]}``.
  Calls are validated against the JSON Schema (violations are observed, not recorded), recorded
  with the observation ``ok``, and scored by BFCL's AST rule (``fc.check``). The episode ends at
  ``<answer>`` or once as many valid calls as ground-truth entries were made. With
  ``partial_credit`` the reward is the share of matched entries.
"""

from __future__ import annotations

from typing import Any

from trace_core.envs import actions as A
from trace_core.envs.base import StepResult, Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.episode import Tool, ToolEpisode
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
        return schema_error(tool.schema.get("parameters", {}), args)

    def on_tool_result(self, name: str, args: dict[str, Any], obs: str, reason: str) -> StepResult | None:
        gt = self.task.payload.get("ground_truth", [])
        if self.mode == "static" and len(self.tool_calls) >= max(1, len(gt)):
            reward, reason, info = self.finish("")
            return self._end(reward, reason, info)
        return None

    def finish(self, answer: str) -> tuple[float, str, dict[str, Any]]:
        p = self.task.payload
        if self.mode == "static":
            gt = p.get("ground_truth", [])
            matched, exact = ast_match(self.tool_calls, gt)
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
    value of each argument ('' = omit is skipped), and no answer turn: the episode ends after
    the last ground-truth call."""
    p = task.payload
    if p.get("mode", "sandbox") == "sandbox":
        return [A.format_call(n, a) for n, a in p["calls"]] + [A.format_answer(p["answer"])]
    out = []
    for entry in p["ground_truth"]:
        (fn, spec), = entry.items()
        args = {}
        for k, allowed in spec.items():
            given = [a for a in (allowed if isinstance(allowed, list) else [allowed]) if a != ""]
            if given:
                args[k] = given[0]
        out.append(A.format_call(fn, args))
    return out
