"""Tiny tokenizer: round trip, single-token markers, one id sequence per entity everywhere."""

from __future__ import annotations

import pytest

from trace_core.policy.chat import SPECIAL_TOKENS, STOP_MARKERS, ChatFormat
from trace_core.policy.tokenizer import TokenizerConfig, train_tokenizer

QUESTION = "Where was Marisol Okonkwo born? The answer is a city."
CALL = '<tool_call>{"name": "search", "arguments": {"query": "Marisol Okonkwo"}}</tool_call>'
OBS = 'Marisol Okonkwo (born 1961) is a painter. "Marisol Okonkwo" was born in Veldhaven, 12 km away.'
ANSWER = "<answer>Veldhaven</answer>"
SYSTEM = "You can call tools: search(query). Answer inside <answer></answer>."


def corpus() -> list[str]:
    base = [SYSTEM, QUESTION, CALL, OBS, ANSWER, "What is (12 + 7) * 3? 57 / 3 = 19.", "calculator(expression)"]
    return [ChatFormat.prompt_text([{"role": "system", "content": s}, {"role": "user", "content": q}])
            for s in base for q in base]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(corpus(), TokenizerConfig(vocab_size=400, min_frequency=2))


def contains(seq: list[int], sub: list[int]) -> int:
    return sum(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_round_trip_and_specials(tok):
    for text in [*corpus()[:5], "unseen ünïcode → text 42\n\ttabs", CALL + ANSWER]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids, skip_special_tokens=False) == text
    for i, marker in enumerate(SPECIAL_TOKENS):
        assert tok.encode(marker, add_special_tokens=False) == [i]
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    chat = ChatFormat(tok)
    assert chat.stop_strings == ()
    assert chat.stop_token_ids == {tok.convert_tokens_to_ids(m) for m in STOP_MARKERS} | {1}


def test_entity_has_same_ids_in_question_argument_and_observation(tok):
    chat = ChatFormat(tok)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    q_ids = chat.prompt_ids(msgs)
    a_ids = chat.action_ids(CALL)
    o_ids = chat.observation_ids(OBS)
    for name in ["Marisol", "Okonkwo", "Veldhaven"]:
        name_ids = chat.encode(name)
        found = [contains(seg, name_ids) for seg in (q_ids, a_ids, o_ids, chat.action_ids(ANSWER))]
        assert found[2] >= 1, name
        if name != "Veldhaven":
            assert found[0] == 1 and found[1] == 1 and found[2] == 2, (name, found)
    # digits are single tokens: a number is always its digits
    assert len(chat.encode("1961")) == 4
