"""Math environment: a calculator tool, reward by numeric / fraction / string equivalence.

Task payload: ``{"answer": str}`` (gold final answer, e.g. "57", "\\frac{1}{3}") and optionally
``{"steps": [expr, ...]}`` — the calculator expressions of a worked solution (synthetic tasks and
GSM8K ``<<...>>`` annotations), from which ``demonstration`` is built.
"""

from __future__ import annotations

from trace_core.envs.actions import format_answer, format_call
from trace_core.envs.base import Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.episode import Tool, ToolEpisode
from trace_core.envs.math.answers import check_math
from trace_core.envs.math.calculator import calculate
from trace_core.envs.prompts import function_schema, system_prompt

CALCULATOR = Tool(
    name="calculator",
    signature="calculator(expression)",
    schema=function_schema("calculator", "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
                           expression=("string", "e.g. (12 + 7) * 3")),
    fn=lambda expression: calculate(expression),
)


class MathEpisode(ToolEpisode):
    def __init__(self, task: Task, cfg: EnvConfig):
        self.tools = {"calculator": CALCULATOR}
        super().__init__(task, cfg, system_prompt([CALCULATOR], cfg.prompt_style))

    def finish(self, answer: str):
        return check_math(answer, str(self.task.payload.get("answer", "")))


class MathEnv:
    name = "math"

    def __init__(self, cfg: EnvConfig):
        self.cfg = cfg

    def reset(self, task: Task) -> MathEpisode:
        return MathEpisode(task, self.cfg)


def demonstration(task: Task) -> list[str]:
    """One calculator call per worked step, then the answer."""
    p = task.payload
    calls = [format_call("calculator", {"expression": e}) for e in p.get("steps", [])]
    return calls + [format_answer(p["answer"])]
