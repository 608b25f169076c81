"""Training checkpoints that resume exactly, stored as data (never pickles).

A checkpoint directory holds::

    model.safetensors (+ config.json)   save_pretrained of the policy (what engines reload)
    tokenizer files                     when a tokenizer is given (so the dir loads standalone)
    trainer_state.safetensors           optimizer, scheduler, RNG states (python, numpy, torch,
                                        cuda), the caller's np.random.Generator, the data cursor

The trainer state is one safetensors file: its tensors (optimizer moments, RNG byte states) as
tensors, everything else as JSON in the header metadata, with tuples, non-string dict keys and
tensors tagged so that the round trip is exact. Loading parses JSON and reads tensors; nothing
in the file is executed. An old pickled ``trainer_state.pt`` is refused, never unpickled.

``save_checkpoint`` writes to a uniquely named temporary sibling, then swaps it into place
(``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere old -> trash, new -> path) and only then
removes the old copy, so a checkpoint path holds the old checkpoint or the whole new one. Files
and directories get the process's default modes (0644 / 0755 under umask 022). After
``load_checkpoint`` the same update sequence gives bit-identical weights on CPU (tested).

Retention (``run.keep_checkpoints``, ``run.keep_best_checkpoint``; ``retire_checkpoints``): a
run keeps its newest N iteration checkpoints and the best by held-out accuracy; an older one is
*retired*: swapped atomically for a directory holding only ``RETIRED.json`` (when, why, what was
removed). A cached stage record that names it is then known to point at a retired checkpoint,
not a lost one, and replays on resume; loading it raises a one-line ``FileNotFoundError``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

STATE_FILE = "trainer_state.safetensors"
RETIRED_FILE = "RETIRED.json"  # all that is left of a checkpoint removed by retention
LEGACY_STATE_FILE = "trainer_state.pt"  # pickled by older versions: refused
FORMAT = "trace-rl-trainer-state/1"


# ----------------------------------------------------------------------------- state <-> data
def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able form of ``obj``; tensors move to ``tensors`` and leave a reference behind."""
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"trainer state holds a {type(obj).__name__}, which is not data (tensor, array, JSON)")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        return np.asarray(obj["__ndarray__"], dtype=np.dtype(obj["dtype"]))
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_hashable(_decode(k, tensors)): _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def _hashable(key: Any) -> Any:
    if isinstance(key, list | dict):
        raise ValueError(f"trainer state: a dict key must be a scalar or tuple, got {key!r}")
    return key


def save_trainer_state(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` (nested dicts / lists / tuples of tensors, arrays and JSON scalars)."""
    tensors: dict[str, torch.Tensor] = {}
    meta = {"format": FORMAT, "state": json.dumps(_encode(state, tensors))}
    save_file(tensors, str(path), metadata=meta)
    return Path(path)


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The state saved by ``save_trainer_state``; ``ValueError`` (one line) for anything else."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:2] == b"PK" or head[:1] == b"\x80":  # torch.save zip archive / raw pickle stream
        raise ValueError(f"{path}: a pickled trainer state; refusing to unpickle it (unsafe)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
        return _decode(json.loads(meta["state"]), tensors)
    except Exception as err:  # safetensors raises its own error types for a bad header
        raise ValueError(f"{path}: not a trainer state written by save_trainer_state ({err})") from None


def has_trainer_state(path: str | Path) -> bool:
    """True if the checkpoint directory holds a trainer state; ``ValueError`` when it holds only
    a legacy pickled one (refused, so that the run does not silently restart its optimizer);
    ``FileNotFoundError`` for a retired checkpoint (its optimizer state is gone)."""
    path = Path(path)
    check_not_retired(path)
    if (path / STATE_FILE).is_file():
        return True
    if (path / LEGACY_STATE_FILE).is_file():
        raise ValueError(f"{path / LEGACY_STATE_FILE}: a pickled trainer state; refusing to unpickle it "
                         f"(unsafe) - delete it to start a fresh optimizer")
    return False


# ----------------------------------------------------------------------------- RNG states
def _rng_state(rng: np.random.Generator | None) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generator": rng.bit_generator.state if rng is not None else None,
    }


def _set_rng_state(state: dict[str, Any], rng: np.random.Generator | None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if rng is not None and state.get("generator") is not None:
        rng.bit_generator.state = state["generator"]


# ----------------------------------------------------------------------------- atomic directories
_RENAME_EXCHANGE = 2  # linux/fs.h


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask sets it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _default_modes(root: Path) -> None:
    """0666 / 0777 less the umask on everything under ``root`` (safetensors writes 0600)."""
    mask = _umask()
    for p in root.rglob("*"):
        p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def replace_dir(tmp: Path, path: Path) -> None:
    """Put directory ``tmp`` at ``path``; an existing ``path`` is removed only after the swap."""
    if not path.exists():
        tmp.rename(path)
        return
    if _exchange(tmp, path):  # tmp now holds the old checkpoint
        shutil.rmtree(tmp)
        return
    trash = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
    path.rename(trash)
    tmp.rename(path)
    shutil.rmtree(trash)


def save_checkpoint(path: str | Path, model: Any, *, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, cursor: dict[str, Any] | None = None,
                    rng: np.random.Generator | None = None, tokenizer: Any = None) -> Path:
    """Write a checkpoint directory atomically; returns its path.

    ``cursor``: JSON-able position in the data / run (e.g. ``{"iteration": 3, "offset": 192}``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(0o777)  # the umask applies (mkdtemp would make it 0700)
    try:
        model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        save_trainer_state({
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": _rng_state(rng),
            "cursor": json.loads(json.dumps(cursor or {})),  # fail early on non-JSON cursors
        }, tmp / STATE_FILE)
        _default_modes(tmp)
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return path


def load_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint / HF model directory (single or sharded safetensors)."""
    from safetensors.torch import load_file

    path = Path(path)
    check_not_retired(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(path / shard)))
        return state
    single = path / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"no model.safetensors (or index) in {path}")
    return load_file(str(single))


def restore_weights(path: str | Path, model: Any) -> None:
    """Copy the weights saved in ``path`` into ``model`` in place (its device and dtype kept)."""
    state = load_model_state(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:  # lm_head may be tied (saved once)
        raise ValueError(f"{path} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


def load_checkpoint(path: str | Path, model: Any, *, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, rng: np.random.Generator | None = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Restore weights (in place), optimizer, scheduler and RNG states; returns the cursor."""
    path = Path(path)
    if not has_trainer_state(path):
        raise FileNotFoundError(f"no {STATE_FILE} in {path}")
    trainer = load_trainer_state(path / STATE_FILE)
    restore_weights(path, model)
    if optimizer is not None and trainer["optimizer"] is not None:
        optimizer.load_state_dict(trainer["optimizer"])
    if scheduler is not None and trainer["scheduler"] is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    if restore_rng:
        _set_rng_state(trainer["rng"], rng)
    return trainer["cursor"]


# ----------------------------------------------------------------------------- retention
def check_not_retired(path: str | Path) -> None:
    """``FileNotFoundError`` (one line) if retention removed the checkpoint at ``path``."""
    marker = Path(path) / RETIRED_FILE
    if marker.is_file():
        raise FileNotFoundError(f"{path}: checkpoint retired by run.keep_checkpoints (weights and optimizer state "
                                f"removed, see {RETIRED_FILE}); restore it from a copy or start a new run id")


def is_retired(path: str | Path) -> bool:
    return (Path(path) / RETIRED_FILE).is_file()


def checkpoints_to_keep(iterations: list[int], accuracy: dict[int, float], keep_last: int | None,
                        keep_best: bool = True) -> set[int]:
    """Which iteration checkpoints keep their files: the ``keep_last`` newest (None = all) and,
    with ``keep_best``, the one with the highest held-out accuracy (``accuracy[i]`` scores the
    checkpoint written by iteration i; the newest wins a tie)."""
    done = sorted(iterations)
    if keep_last is None:
        return set(done)
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (resume needs the newest checkpoint), got {keep_last}")
    keep = set(done[-keep_last:])
    scored = [(acc, i) for i, acc in accuracy.items() if i in done and acc is not None]
    if keep_best and scored:
        keep.add(max(scored)[1])
    return keep


def retire_checkpoint(path: str | Path, reason: str) -> None:
    """Replace the checkpoint at ``path`` by a directory holding only ``RETIRED.json``, atomically
    (a reader sees the whole checkpoint or the marker), then free the space."""
    path = Path(path)
    removed = sorted(p.name for p in path.iterdir())
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(0o777)
    try:
        (tmp / RETIRED_FILE).write_text(json.dumps({"reason": reason, "removed": removed, "bytes": size}) + "\n")
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def retire_checkpoints(root: str | Path, accuracy: dict[int, float], keep_last: int | None,
                       keep_best: bool = True, newest: int | None = None) -> list[Path]:
    """Apply retention to the ``iter=NNNNN`` checkpoints under ``root`` (a run's checkpoint
    directory) after an iteration has finished and been recorded; returns those retired now.

    Call it only once the newest checkpoint's iteration is recorded: the next iteration (and a
    resume after a crash in it) starts from the newest, which is always kept. Retired ones stay
    retired (a later, better accuracy does not bring one back). ``newest``: the iteration just
    recorded; checkpoints after it (a resume replaying iterations whose later checkpoints are
    already on disk, their accuracies not yet replayed) are left alone."""
    root = Path(root)
    if keep_last is None or not root.is_dir():
        return []
    live = {int(p.name[5:]): p for p in root.glob("iter=*")
            if p.is_dir() and p.name[5:].isdigit() and not is_retired(p)
            and (newest is None or int(p.name[5:]) <= newest)}
    keep = checkpoints_to_keep(list(live), accuracy, keep_last, keep_best)
    retired = []
    for i in sorted(set(live) - keep):
        why = f"not among the {keep_last} newest" + (" nor the best by held-out accuracy" if keep_best else "")
        retire_checkpoint(live[i], why)
        retired.append(live[i])
    return retired
