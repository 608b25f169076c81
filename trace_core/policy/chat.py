"""The Qwen3-style chat format every policy uses (the tiny model and real Qwen3 alike).

One episode as text::

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n{question}<|im_end|>\\n
    <|im_start|>assistant\\n{action}<|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{observation}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n{action} ...

An action ends with its stop marker (``</tool_call>``, ``</answer>``; ``<|im_end|>`` or eos
for a turn with neither), and the ``<|im_end|>`` that closes the assistant turn belongs to the
observation segment: the policy emits tokens up to and including the stop marker, the
environment supplies everything after it. So the token sequence of an episode is exactly

    prompt_ids(messages) + action_0 + observation_ids(obs_0) + action_1 + ...

and generation, SFT and the policy update all see the same ids. Segments are encoded
separately and concatenated; with special tokens at every boundary this equals encoding the
whole text at once (tested for the tiny tokenizer).

Real models (``model.chat_template: tokenizer``) take the prompt and the text around an
observation from the model's own chat template (``tokenizer.apply_chat_template``, with
``enable_thinking`` passed through for Qwen3): the prompt is the template's rendering of the
system and user messages with the generation prompt; the observation segment is what the template
puts between an assistant turn and the next generation prompt around a tool message (found by
rendering a probe conversation once). Episodes stay incremental — the model sees its own earlier
turns, thoughts included, exactly as it generated them — which is what the update trains on.
Qwen3's tool calls (``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``) are the
envs' action format as they come (``trace_core.envs.actions.parse_action`` skips a leading
``<think>`` block and the newlines inside the markers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
ANSWER = "<answer>"
ANSWER_END = "</answer>"
TOOL_RESPONSE = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
PAD = "<|pad|>"
EOS = "<|endoftext|>"

#: Every marker the tiny tokenizer holds as one special token (ids 0.. in this order).
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD, EOS, IM_START, IM_END, TOOL_CALL, TOOL_CALL_END, ANSWER, ANSWER_END, TOOL_RESPONSE, TOOL_RESPONSE_END,
)
#: Markers that end an assistant action.
STOP_MARKERS: tuple[str, ...] = (TOOL_CALL_END, ANSWER_END, IM_END)


class ChatFormat:
    """Turns chat messages, actions and observations into token ids and back.

    ``tokenizer`` is any Hugging Face tokenizer (``encode(text, add_special_tokens=False)``,
    ``decode(ids, skip_special_tokens=False)``, ``eos_token_id``).

    Attributes:
        stop_token_ids: ids that end an action when they are single tokens: ``</tool_call>``,
            ``</answer>``, ``<|im_end|>`` and eos. Stopping is then an id check.
        stop_strings: markers that are *not* single tokens in this tokenizer (empty for the
            tiny tokenizer; e.g. ``</answer>`` for real Qwen3): an engine must also stop when
            the decoded action text ends with one of these.
    """

    def __init__(self, tokenizer: Any, *, template: str = "builtin", enable_thinking: bool | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.enable_thinking = enable_thinking
        self._obs_parts: tuple[str, str] | None = None
        if template == "tokenizer":
            self._obs_parts = self._template_observation_parts()
        elif template != "builtin":
            raise ValueError(f"unknown chat template mode {template!r}; known: builtin, tokenizer")
        stop_ids: set[int] = set()
        stop_strings: list[str] = []
        for marker in STOP_MARKERS:
            ids = self.encode(marker)
            if len(ids) == 1:
                stop_ids.add(ids[0])
            else:
                stop_strings.append(marker)
        if tokenizer.eos_token_id is not None:
            stop_ids.add(int(tokenizer.eos_token_id))
        self.stop_token_ids: set[int] = stop_ids
        self.stop_strings: tuple[str, ...] = tuple(stop_strings)
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad if pad is not None else tokenizer.eos_token_id)
        self._im_end_ids = self.encode(IM_END)

    # -- encoding ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Plain text -> ids, no BOS/EOS added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text with every marker kept (the env parser needs them)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @staticmethod
    def render_messages(messages: list[dict[str, str]]) -> str:
        """Messages (roles system / user / assistant / tool) as chat text, each turn closed.

        A ``tool`` message is rendered as a user turn wrapping its content in
        ``<tool_response>``, as Qwen3's template does.
        """
        parts = []
        for msg in messages:
            role, content = msg["role"], msg["content"]
            if role == "tool":
                role, content = "user", f"{TOOL_RESPONSE}\n{content}\n{TOOL_RESPONSE_END}"
            elif role not in ("system", "user", "assistant"):
                raise ValueError(f"unknown chat role {role!r}; known: system, user, assistant, tool")
            parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
        return "".join(parts)

    @staticmethod
    def prompt_text(messages: list[dict[str, str]]) -> str:
        """Messages plus the opening of the assistant turn."""
        return ChatFormat.render_messages(messages) + f"{IM_START}assistant\n"

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of the messages up to and including the opening ``<|im_start|>assistant\\n`` (with
        the tokenizer's template: its generation prompt, e.g. Qwen3's empty think block when
        thinking is off)."""
        if self.template == "tokenizer":
            return self.encode(self._apply(messages))
        return self.encode(self.prompt_text(messages))

    # -- the model's own chat template -----------------------------------------------------------
    def _apply(self, messages: list[dict[str, str]]) -> str:
        kw = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)

    def _template_observation_parts(self) -> tuple[str, str]:
        """``(before, after)``: the template's text between an assistant turn's content and a tool
        message's content, and from there to the next generation prompt's end."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("model.chat_template=tokenizer but the tokenizer has no chat_template "
                             "(tokenizer_config.json / chat_template.jinja); use model.chat_template=builtin")
        act, obs = "\x1eTRACE_ACTION\x1e", "\x1eTRACE_OBSERVATION\x1e"
        text = self._apply([{"role": "user", "content": "q"}, {"role": "assistant", "content": act},
                            {"role": "tool", "content": obs}])
        a, o = text.find(act), text.find(obs)
        if a < 0 or o < a:
            raise ValueError("the tokenizer's chat template does not render an assistant turn followed by a "
                             "tool message; use model.chat_template=builtin")
        return text[a + len(act):o], text[o + len(obs):]

    @staticmethod
    def observation_text(observation: str, *, action_closed: bool = False) -> str:
        """Text between one action and the next. ``action_closed``: the action already ended
        with ``<|im_end|>`` (no marker in it), so it is not repeated."""
        head = "\n" if action_closed else f"{IM_END}\n"
        return (f"{head}{IM_START}user\n{TOOL_RESPONSE}\n{observation}\n{TOOL_RESPONSE_END}{IM_END}\n"
                f"{IM_START}assistant\n")

    def observation_ids(self, observation: str, *, action_closed: bool = False) -> list[int]:
        """Ids that follow an action: ``<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n
        {observation}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n`` (with the tokenizer's
        template: what it renders around a tool message, then its generation prompt)."""
        if self._obs_parts is not None:
            before, after = self._obs_parts
            if action_closed and before.startswith(IM_END):
                before = before[len(IM_END):]
            return self.encode(before + observation + after)
        return self.encode(self.observation_text(observation, action_closed=action_closed))

    def action_ids(self, action: str | Sequence[int]) -> list[int]:
        """An action as ids: text is encoded, ids (as generated) are kept unchanged."""
        return self.encode(action) if isinstance(action, str) else [int(i) for i in action]

    def ends_closed(self, action_ids: Sequence[int]) -> bool:
        """True when the action already ends with ``<|im_end|>``."""
        n = len(self._im_end_ids)
        return n > 0 and list(action_ids[-n:]) == self._im_end_ids

    def episode_ids(
        self,
        messages: list[dict[str, str]],
        actions: Sequence[str | Sequence[int]],
        observations: Sequence[str],
    ) -> tuple[list[int], list[int]]:
        """One episode as ``(input_ids, assistant_mask)``, both of length L.

        ``actions[t]`` is the text or the generated ids of turn t (ending with its stop marker);
        ``observations[t]`` is the tool output after it. ``len(observations)`` is
        ``len(actions)`` (the last one is then appended too) or ``len(actions) - 1`` (the episode
        ended on the last action). ``assistant_mask[i] = 1`` on action tokens, stop marker
        included; 0 on prompt and observation tokens.
        """
        if len(observations) not in (len(actions), len(actions) - 1):
            raise ValueError(f"{len(actions)} actions need {len(actions) - 1} or {len(actions)} "
                             f"observations, got {len(observations)}")
        ids = self.prompt_ids(messages)
        mask = [0] * len(ids)
        for t, action in enumerate(actions):
            a_ids = self.action_ids(action)
            ids += a_ids
            mask += [1] * len(a_ids)
            if t < len(observations):
                o_ids = self.observation_ids(observations[t], action_closed=self.ends_closed(a_ids))
                ids += o_ids
                mask += [0] * len(o_ids)
        return ids, mask

    def is_stop(self, action_ids: Sequence[int]) -> bool:
        """Whether a partial action has ended (last id a stop id, or text ends with a stop string)."""
        if action_ids and int(action_ids[-1]) in self.stop_token_ids:
            return True
        if self.stop_strings:
            tail = self.decode(list(action_ids[-16:]))
            return any(tail.endswith(s) for s in self.stop_strings)
        return False
