"""Environment protocol: a task record -> initial chat messages -> steps on assistant turns.

Action format (one per assistant turn, close to what Qwen3 emits):

* a tool call:     ``<tool_call>{"name": "calculator", "arguments": {"expression": "3 * 4"}}</tool_call>``
* a final answer:  ``<answer>12</answer>``

Free text before the marker is the turn's thought and is ignored by the parser. An episode
ends on an answer (reward from the verifier), on a malformed action (reward 0 unless the
config grants partial credit), or on the turn / token limit. Every outcome carries a reason
code; no model output raises.

Tools are deterministic, so the state at any prefix node is rebuilt by ``env.reset(task)``
and replaying that prefix's actions (``replay``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Task:
    """One prompt. ``payload`` holds what the family's verifier and tools need."""

    prompt_id: str
    family: str  # 'math' | 'qa' | 'fc'
    difficulty: int  # family-specific difficulty level, 0 = easiest
    question: str
    payload: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class StepResult:
    observation: str | None  # tool output shown to the model; None when the episode ended
    done: bool
    reward: float = 0.0  # final reward when done
    reason: str = "ok"  # reason code, e.g. 'correct', 'wrong_answer', 'malformed_json', 'turn_limit'
    info: dict[str, Any] = field(default_factory=dict)  # e.g. {'f1': 0.5, 'tool_error': True}


class Episode(Protocol):
    def messages(self) -> list[dict[str, str]]:
        """Initial chat messages: system (with the tool schemas) and user (the question)."""

    def step(self, action_text: str) -> StepResult:
        """Consume one assistant turn; return the observation or the final outcome."""


class Env(Protocol):
    name: str

    def reset(self, task: Task) -> Episode: ...


def replay(env: Env, task: Task, actions: list[str]) -> tuple[Episode, list[StepResult]]:
    """Rebuild the episode state after ``actions`` (deterministic tools make this exact)."""
    ep = env.reset(task)
    results = [ep.step(a) for a in actions]
    return ep, results
