"""A small BPE tokenizer trained locally on the generators' text (no hub access).

Pre-tokenization cuts text into words (letters only), single digits, and runs of everything
else (spaces, quotes, braces, operators) before BPE runs, so a merge never crosses a word
boundary. Why: a BPE that glues a leading space or quote to a name gives one entity several
ids (``Paris`` in the question, ``"Paris`` in a JSON tool argument, `` Paris`` in an
observation), and the tiny model then has to learn three names for one thing. Here a word
has one id sequence wherever it appears and a number is always its digits, while the JSON
skeleton (``": "``, ``"}}``) still compresses to few tokens: episodes are ~1/3 shorter than
with every space and punctuation mark alone, which matters at CPU training speed. Bytes are mapped ByteLevel-style, so any
input text encodes (no ``<unk>``).

The chat, tool-call and answer markers of :mod:`trace_core.policy.chat` are single special
tokens (ids 0..9), so stopping on ``</tool_call>`` or ``</answer>`` is a token-id check.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trace_core.policy.chat import EOS, PAD, SPECIAL_TOKENS
from trace_core.policy.config import TokenizerConfig


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        # a word | one digit | a run of anything else (spaces, quotes, braces, operators)
        pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}|[^\p{L}\p{N}]+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),  # bytes -> symbols
    ])


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig | None = None) -> PreTrainedTokenizerFast:
    """Train the BPE on ``texts`` and wrap it as a transformers fast tokenizer.

    Returns a tokenizer with ``pad_token='<|pad|>'`` (id 0) and ``eos_token='<|endoftext|>'``
    (id 1); the remaining chat markers are additional special tokens (ids 2..9).
    """
    cfg = cfg or TokenizerConfig()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """A raw ``tokenizers.Tokenizer`` with our specials -> ``PreTrainedTokenizerFast``."""
    extra = [t for t in SPECIAL_TOKENS if t not in (PAD, EOS)]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=extra,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.padding_side = "left"  # batched generation pads on the left
    return fast


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """``save_pretrained`` into ``out_dir`` (tokenizer.json + configs)."""
    tokenizer.save_pretrained(str(out_dir))
