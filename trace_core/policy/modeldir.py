"""What a model directory must be before anything loads it: data, checked, never executed.

A model directory (``model.path``, a checkpoint, ``warmup.init_from``, a predictor's encoder) is
loaded from safetensors weights and JSON only. ``check_model_dir`` refuses, with a one-line
``ModelDirError`` naming the file, a directory that is missing; whose ``config.json`` is absent,
not a regular file, over ``MAX_CONFIG_BYTES`` or not a JSON object naming a ``model_type``; that
holds pickled weights (``pytorch_model.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``, ``*.pkl``: unpickling
runs code) instead of safetensors; whose safetensors files are not regular files or have an
unreadable header (truncated, garbage, oversized header); or whose tokenizer JSON files are not
regular files, are over ``MAX_TOKENIZER_BYTES`` or not JSON. Loaders also pass
``use_safetensors=True``, so a pickled file beside safetensors is never read either.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

MAX_CONFIG_BYTES = 1 << 20  # a Qwen3 config.json is ~1 KB
MAX_TOKENIZER_BYTES = 256 << 20  # Qwen3's tokenizer.json is ~11 MB
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header
PICKLED = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle", "tf_model.h5", "flax_model.msgpack")
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                  "added_tokens.json", "vocab.json")


class ModelDirError(ValueError):
    """A model directory that cannot be loaded safely; the message names the file."""


def _regular(path: Path, what: str) -> os.stat_result:
    try:
        st = os.stat(path)  # a symlink is followed: its target must be a regular file too
    except OSError as err:
        raise ModelDirError(f"model directory: {what} {path} cannot be read ({err.strerror or err})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelDirError(f"model directory: {what} {path} is not a regular file")
    return st


def _json_object(path: Path, limit: int, what: str) -> dict:
    if _regular(path, what).st_size > limit:
        raise ModelDirError(f"model directory: {what} {path} is over {limit} bytes")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ModelDirError(f"model directory: {what} {path} is not valid JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise ModelDirError(f"model directory: {what} {path} is not a JSON object")
    return data


def _safetensors_header(path: Path) -> None:
    size = _regular(path, "weights file").st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if n <= 0 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise ValueError("bad header length")
            header = json.loads(f.read(n).decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        end = max([int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"] or [0])
        if 8 + n + end > size:
            raise ValueError("truncated")
    except (OSError, ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, struct.error) as err:
        raise ModelDirError(f"model directory: weights file {path} is not a readable safetensors file ({err})") from None


def check_model_dir(path: str | Path) -> Path:
    """``path`` if it is a loadable model directory (see the module docstring), else ``ModelDirError``."""
    path = Path(path)
    if not path.is_dir():
        raise ModelDirError(f"model directory {path} does not exist or is not a directory")
    cfg = _json_object(path / "config.json", MAX_CONFIG_BYTES, "config")
    if not isinstance(cfg.get("model_type"), str):
        raise ModelDirError(f"model directory: config {path / 'config.json'} names no model_type")
    weights = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.exists():
        _json_object(index, MAX_CONFIG_BYTES * 16, "weights index")
    if not weights:
        pickled = sorted({p.name for pattern in PICKLED for p in path.glob(pattern)})
        found = f"only pickled weights ({', '.join(pickled)}), which are never unpickled" if pickled else "no weights"
        raise ModelDirError(f"model directory {path} holds {found}; save it with safetensors "
                            "(save_pretrained(..., safe_serialization=True))")
    for w in weights:
        _safetensors_header(w)
    for name in TOKENIZER_JSON:
        if (path / name).exists() or (path / name).is_symlink():
            _json_object(path / name, MAX_TOKENIZER_BYTES, "tokenizer file")
    return path
