"""The policy the benchmarks run: the shipped tiny-warm checkpoint, else a random model of the same sizes."""

from __future__ import annotations

from typing import Any

from trace_core.envs import make_env
from trace_core.envs.synthetic import demonstration, generate_tasks
from trace_core.policy.chat import ChatFormat
from trace_core.policy.model import TINY_WARM_DIR, ModelConfig, build_model, load_policy
from trace_core.policy.tokenizer import train_tokenizer


def bench_policy(path: str | None = None) -> tuple[Any, ChatFormat, str]:
    """(model, chat, description)."""
    if path or (TINY_WARM_DIR / "config.json").is_file():
        model, tok = load_policy(path)
        return model, ChatFormat(tok), f"checkpoint {path or TINY_WARM_DIR}"
    texts = []
    for fam in ("math", "qa", "fc"):
        env = make_env(fam)
        for t in generate_tasks(fam, 100, 1, seed=0):
            texts.append(ChatFormat.render_messages(env.reset(t).messages()) + "".join(demonstration(t)))
    tok = train_tokenizer(texts)
    model = build_model(ModelConfig(vocab_size=len(tok)), seed=0, pad_token_id=tok.pad_token_id,
                        eos_token_id=tok.eos_token_id)
    return model, ChatFormat(tok), "random-init tiny Qwen3 (default sizes; tiny-warm not built yet)"
