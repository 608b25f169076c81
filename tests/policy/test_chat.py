"""Chat format: segment ids concatenate to the whole text's ids; masks cover actions only."""

from __future__ import annotations

import pytest

from trace_core.policy.chat import ChatFormat
from trace_core.policy.tokenizer import TokenizerConfig, train_tokenizer

MSGS = [{"role": "system", "content": "tools: calculator(expression)"}, {"role": "user", "content": "What is 3 * 4 + 1?"}]
ACTIONS = ['<tool_call>{"name": "calculator", "arguments": {"expression": "3 * 4"}}</tool_call>',
           "I add one. <answer>13</answer>"]
OBS = ["12"]


@pytest.fixture(scope="module")
def chat():
    texts = [ChatFormat.prompt_text(MSGS) + ACTIONS[0] + ChatFormat.observation_text(OBS[0]) + ACTIONS[1]] * 20
    return ChatFormat(train_tokenizer(texts, TokenizerConfig(vocab_size=320)))


def test_episode_ids_equal_whole_text_and_mask_actions(chat):
    ids, mask = chat.episode_ids(MSGS, ACTIONS, OBS)
    text = ChatFormat.prompt_text(MSGS) + ACTIONS[0] + ChatFormat.observation_text(OBS[0]) + ACTIONS[1]
    assert ids == chat.encode(text)
    assert chat.decode(ids) == text
    assert len(mask) == len(ids)
    masked = [i for i, m in zip(ids, mask, strict=True) if m]
    assert chat.decode(masked) == "".join(ACTIONS)
    # the stop marker is inside the mask, the closing <|im_end|> is not
    first_stop = ids.index(chat.encode("</tool_call>")[0])
    assert mask[first_stop] == 1 and mask[first_stop + 1] == 0
    assert chat.decode([ids[first_stop + 1]]) == "<|im_end|>"
    assert chat.is_stop(chat.action_ids(ACTIONS[0])) and not chat.is_stop(chat.action_ids("<answer>1"))


def test_prompt_ids_end_at_assistant_and_tool_role(chat):
    ids = chat.prompt_ids(MSGS)
    assert chat.decode(ids).endswith("<|im_start|>assistant\n")
    with_tool = MSGS + [{"role": "assistant", "content": ACTIONS[0]}, {"role": "tool", "content": OBS[0]}]
    ep, _ = chat.episode_ids(MSGS, ACTIONS[:1], OBS)
    assert chat.prompt_ids(with_tool)[len(ids):] != []  # tool turns render like observations
    assert chat.decode(chat.prompt_ids(with_tool)) == chat.decode(ep)


def test_closed_action_and_count_check(chat):
    ids, mask = chat.episode_ids(MSGS, ["no marker<|im_end|>"], ["error: no action"])
    assert "<|im_end|><|im_end|>" not in chat.decode(ids)
    with pytest.raises(ValueError, match="observations"):
        chat.episode_ids(MSGS, ACTIONS, [])
