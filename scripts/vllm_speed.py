"""The vLLM worker's load time and decoding speed on a model directory, with a run config's engine
settings (run inside the vLLM worker environment):

    DIR/bin/python scripts/vllm_speed.py .rehearsal/qwen3-toy [--config configs/qwen3-rehearsal.yaml]

Builds the project's ``VLLMEngine`` the way a rollout worker does (the config's ``vllm`` section,
``model.dtype``, the model's chat template), times the load, then samples ``--requests`` x ``--n``
actions of ``--tokens`` new tokens each from the chat prompt of a math question and prints the
generated tokens per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model directory (e.g. trace-rl qwen3-toy --out DIR)")
    ap.add_argument("--config", default=str(ROOT / "configs" / "qwen3-rehearsal.yaml"))
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--n", type=int, default=4, help="samples per request")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per sample")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from trace_core.config import load_train_config
    from trace_core.engines.base import GenRequest
    from trace_core.engines.config import SamplingConfig
    from trace_core.engines.vllm import VLLMEngine
    from trace_core.policy.chat import ChatFormat

    cfg = load_train_config(args.config, [f"model.path={args.model}"])
    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    chat = ChatFormat(tok, template=cfg.model.chat_template, enable_thinking=cfg.model.enable_thinking)
    t0 = time.perf_counter()
    engine = VLLMEngine(args.model, chat, config=cfg.vllm, dtype=cfg.model.dtype)
    load_s = time.perf_counter() - t0
    prompt = chat.prompt_ids([{"role": "system", "content": "Solve it."},
                              {"role": "user", "content": "What is 3 * 4 + 1?"}])
    reqs = [GenRequest(prompt_ids=tuple(prompt), n=args.n, seed=i) for i in range(args.requests)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.tokens)
    engine.generate(reqs[:1], SamplingConfig(temperature=1.0, max_new_tokens=4))  # warm the first batch
    t0 = time.perf_counter()
    out = engine.generate(reqs, sampling)
    gen_s = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for per in out for r in per)
    print(json.dumps({"model": args.model, "load_s": round(load_s, 1), "prompt_tokens": len(prompt),
                      "samples": args.requests * args.n, "generated_tokens": tokens,
                      "generate_s": round(gen_s, 2), "tokens_per_s": round(tokens / gen_s, 1),
                      "enforce_eager": cfg.vllm.enforce_eager, "dtype": cfg.model.dtype}))


if __name__ == "__main__":
    main()
