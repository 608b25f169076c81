"""Chat format: segment ids concatenate to the whole text's ids; masks cover actions only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trace_core.policy.chat import ChatFormat
from trace_core.policy.config import TINY_WARM_DIR
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


# ----------------------------------------------------------------------------- the model's own template
QWEN3_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text()  # Qwen3's published template
QWEN3_TURN = ('<think>\nI need 3 * 4 first.\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": '
              '{"expression": "3 * 4"}}\n</tool_call>')


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """A local model directory with a Qwen3-style tokenizer: the tiny checkpoint plus Qwen3's chat
    template in tokenizer_config.json (no hub download)."""
    out = tmp_path_factory.mktemp("qwen3-style")
    for f in TINY_WARM_DIR.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**tc, "chat_template": QWEN3_TEMPLATE}))
    return out


@pytest.mark.parametrize("thinking", [False, True])
def test_template_prompt_and_observations_equal_the_templates_rendering(qwen3_dir, thinking):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_dir), local_files_only=True)
    chat = ChatFormat(tok, template="tokenizer", enable_thinking=thinking)
    prompt = tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    assert chat.decode(chat.prompt_ids(MSGS)) == prompt
    assert prompt.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))
    # the episode is incremental: the prompt as generated from (empty think block included, which the
    # template drops from history), the action as generated, then exactly what the template renders
    # after an assistant turn around the tool message, up to the next generation prompt
    ids, mask = chat.episode_ids(MSGS, ACTIONS, OBS)
    conv = MSGS + [{"role": "assistant", "content": ACTIONS[0]}, {"role": "tool", "content": OBS[0]}]
    whole = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    after_action = whole[whole.index(ACTIONS[0]) + len(ACTIONS[0]):]
    assert after_action.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n12\n</tool_response>")
    assert chat.decode(ids) == prompt + ACTIONS[0] + after_action + ACTIONS[1]
    if thinking:  # nothing dropped from history: the whole conversation renders the same
        assert chat.decode(ids) == whole + ACTIONS[1]
    assert chat.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "".join(ACTIONS)
    # a turn closed by <|im_end|> (no marker) is not closed twice
    closed, _ = chat.episode_ids(MSGS, ["no marker<|im_end|>"], ["error: no action"])
    assert "<|im_end|><|im_end|>" not in chat.decode(closed)


def test_qwen3_tool_call_turn_is_the_envs_action(qwen3_dir):
    from trace_core.envs import make_env
    from trace_core.envs.actions import parse_action
    from trace_core.envs.base import Task

    act = parse_action(QWEN3_TURN)
    assert (act.kind, act.name, act.arguments) == ("tool_call", "calculator", {"expression": "3 * 4"})
    ep = make_env("math").reset(Task("t", "math", 0, "What is 3 * 4 + 1?", {"answer": "13"}))
    assert ep.step(QWEN3_TURN).observation.strip() == "12"
    assert ep.step("<think>\nso 13\n</think>\n\n<answer>13</answer>").reward == 1.0


def test_template_mode_errors_are_one_line(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY_WARM_DIR), local_files_only=True)
    with pytest.raises(ValueError, match="has no chat_template"):
        ChatFormat(tok, template="tokenizer")
    with pytest.raises(ValueError, match="unknown chat template mode 'jinja'"):
        ChatFormat(tok, template="jinja")


def test_run_config_selects_the_template_and_rollouts_use_it(qwen3_dir, monkeypatch):
    from trace_core.config import TrainConfig
    from trace_core.envs import make_env
    from trace_core.envs.base import Task
    from trace_core.policy.live import LivePolicy
    from trace_core.rollout.agent_loop import RolloutConfig, run_rollouts

    cfg = TrainConfig.model_validate({"model": {"path": str(qwen3_dir), "chat_template": "tokenizer",
                                                "enable_thinking": False}, "run": {"device": "cpu"}})
    pol = LivePolicy(cfg).get(str(qwen3_dir))  # built from this model
    assert pol.chat.template == "tokenizer" and pol.chat.enable_thinking is False
    task = Task("t", "math", 0, "What is 3 * 4 + 1?", {"answer": "13"})
    nodes = run_rollouts(pol.engine, pol.chat, {"math": make_env("math")}, [task], [2],
                         sampling=cfg.sampling.model_copy(update={"max_new_tokens": 24}),
                         cfg=RolloutConfig(max_turns=2, progress=False), seed=0)
    assert int(nodes["is_leaf"].sum()) == 2
