"""A throwaway tiny policy for fast tests: a locally trained tokenizer + a random-init Qwen3.

Random weights are enough where the trained checkpoint is not needed (engine mechanics, the
update's direction, checkpoints). Built in well under a second.
"""

from __future__ import annotations

import functools

import pytest

from trace_core.policy.chat import ChatFormat
from trace_core.policy.model import ModelConfig, build_model
from trace_core.policy.tokenizer import TokenizerConfig, train_tokenizer

_CORPUS = [
    'What is 12 * 7 + 3? <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>',
    "<tool_response>\n84\n</tool_response> <answer>87</answer> the capital of France is Paris",
    'search {"name": "search", "arguments": {"query": "who directed the film"}} lookup weather city',
    "system user assistant You are a helpful agent. Use tools. Answer with <answer>...</answer>.",
] * 4


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    return train_tokenizer(_CORPUS, TokenizerConfig(vocab_size=400, min_frequency=1))


def tiny_chat() -> ChatFormat:
    return ChatFormat(tiny_tokenizer())


def tiny_model(seed: int = 0, vocab_size: int | None = None):
    tok = tiny_tokenizer()
    cfg = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                      intermediate_size=128, vocab_size=vocab_size or len(tok), max_position_embeddings=1024)
    return build_model(cfg, seed=seed, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)


def spread_model(seed: int = 0, std: float = 0.15):
    """A random model with larger weights, so greedy outputs vary instead of repeating one token."""
    import torch

    model = tiny_model(seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def prompts(chat: ChatFormat) -> list[tuple[int, ...]]:
    """Three chat prompts of different lengths (exercise left padding)."""
    qs = ["What is 12 * 7?", "What is 3 + 4 * 2 - 1? Use the calculator.", "capital of France"]
    return [tuple(chat.prompt_ids([{"role": "user", "content": q}])) for q in qs]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run ~5x faster on one thread when the CPU is shared (2 cores, many jobs)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
